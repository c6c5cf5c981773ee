"""The invoice example: a daily job that must never create two invoices for one period."""
