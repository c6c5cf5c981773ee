"""Cluster: which beat node may materialize which logical shards.

shards: shard leases with fencing tokens (acquire, renew, release, the lease keeper);
reshard: keep every schedule and outbox row inside ``shard_count`` (beat's start check and
``manage.py reshard``).
"""
