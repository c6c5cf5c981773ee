"""Reference pages rendered from the code, so they cannot drift from it.

Directives (used in docs/reference/*.md):

- ``scheduler-settings``: every ``CELERY_SCHEDULER`` key from the frozen dataclass
  ``django_app.conf.SchedulerSettings``: its type, its default and the ``#:`` comment above it.
- ``scheduler-command NAME``: a management command's ``--help``, from its own argument parser
  (and each sub-command's). Every command of ``django_app`` must be documented once: a missing
  one is a build warning, so ``-W`` fails the build when a command is added without its page.
- ``scheduler-metrics``: every Prometheus metric of ``celery_scheduler.metrics``: full name,
  type, labels and help text (the help a scrape shows).
- ``scheduler-openapi``: every operation of the HTTP API from the OpenAPI document that
  drf-spectacular generates from the views at build time; the document itself is written
  next to the pages as ``openapi.json``.

No library renders these: sphinx-argparse wants a module-level parser factory, which Django
commands do not have (their parser is built per call by ``create_parser``), and the OpenAPI
renderers for Sphinx fetch a file rather than generate it from the views.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)

# ``code``, `code` and :role:`target` in the code's comments and help texts.
_INLINE = re.compile(r"``(.+?)``|`([^`]+)`|:[a-z:]+:`~?([^`]+)`")


def _inline(text: str) -> list[nodes.Node]:
    """Text with its literals as literal nodes (the comments are reST-flavoured)."""
    out: list[nodes.Node] = []
    pos = 0
    for match in _INLINE.finditer(text):
        out.append(nodes.Text(text[pos : match.start()]))
        literal = next(group for group in match.groups() if group is not None)
        out.append(nodes.literal(literal, literal))
        pos = match.end()
    out.append(nodes.Text(text[pos:]))
    return out


def _table(
    header: list[str], rows: Iterable[list[list[nodes.Node]]], widths: list[int]
) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    head += _row([[nodes.Text(title)] for title in header])
    body = nodes.tbody()
    group += body
    for cells in rows:
        body += _row(cells)
    return table


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    row = nodes.row()
    for content in cells:
        entry = nodes.entry()
        paragraph = nodes.paragraph()
        paragraph.extend(content)
        entry += paragraph
        row += entry
    return row


def _code(text: str) -> list[nodes.Node]:
    return [nodes.literal(text, text)]


class SettingsDirective(SphinxDirective):
    """The ``CELERY_SCHEDULER`` keys, read from ``django_app.conf.SchedulerSettings``."""

    def run(self) -> list[nodes.Node]:
        from django_app import conf

        self.env.note_dependency(conf.__file__)
        comments = ModuleAnalyzer.for_module(conf.__name__).find_attr_docs()
        rows = []
        for field in dataclasses.fields(conf.SchedulerSettings):
            doc = " ".join(comments.get(("SchedulerSettings", field.name), [])).strip()
            if not doc:
                # A setting without its ``#:`` comment fails the build (-W): every key is
                # documented where it is defined.
                LOG.warning("setting %r has no #: comment in django_app/conf.py", field.name)
            rows.append(
                [
                    _code(field.name),
                    _code(str(field.type)),
                    _code(repr(field.default)),
                    _inline(doc),
                ]
            )
        return [_table(["Key", "Type", "Default", "Meaning"], rows, [18, 10, 10, 62])]


class CommandDirective(SphinxDirective):
    """One management command's help, from the parser Django builds for it."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        from django.core.management import load_command_class

        name = self.arguments[0]
        command = load_command_class("django_app", name)
        self.env.note_dependency(inspect.getfile(type(command)))
        documented: dict[str, str] = self.env.domaindata.setdefault("scheduler_commands", {})
        documented[name] = self.env.docname
        # argparse wraps to the terminal's width: fix it so a build is the same everywhere
        # (and the block fits the page).
        os.environ["COLUMNS"] = "88"
        # Django's common options are the same for every command: the page says so once.
        command.suppressed_base_arguments = set(DJANGO_COMMON_OPTIONS)
        parser = command.create_parser("manage.py", name)
        result: list[nodes.Node] = [_help_block(parser)]
        for sub_name, sub_parser in _subcommands(parser):
            result.append(nodes.rubric(text=f"manage.py {name} {sub_name}"))
            result.append(_help_block(sub_parser))
        return result


#: Options every Django command takes, left out of each command's help.
DJANGO_COMMON_OPTIONS = (
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
)  # --skip-checks stays: only commands that run the system checks take it


def _help_block(parser: argparse.ArgumentParser) -> nodes.literal_block:
    block = nodes.literal_block(text=parser.format_help().rstrip())
    block["language"] = "text"  # not highlighted as code
    return block


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.items())
    return found


def _check_commands(app: Sphinx, env: BuildEnvironment) -> None:
    """Warn (an error under -W) for a management command no page documents."""
    from django.core.management import find_commands

    commands_dir = Path(inspect.getfile(importlib.import_module("django_app"))).parent
    commands_dir /= "management"
    documented = env.domaindata.get("scheduler_commands", {})
    for name in sorted(find_commands(str(commands_dir))):
        if name not in documented:
            LOG.warning("management command %r is not documented (scheduler-command)", name)


class MetricsDirective(SphinxDirective):
    """Every metric the registry can expose, with the help text a scrape shows."""

    def run(self) -> list[nodes.Node]:
        from celery_scheduler import metrics

        self.env.note_dependency(metrics.__file__)
        # The specs are module-private tables; they are what registers each metric.
        kinds = [
            ("counter", metrics._COUNTERS),
            ("gauge", metrics._GAUGES),
            ("histogram", metrics._HISTOGRAMS),
        ]
        rows = [
            [
                _code(metrics.PREFIX + name),
                [nodes.Text(kind)],
                [nodes.Text(", ".join(spec.labels))],
                _inline(spec.help),
            ]
            for kind, specs in kinds
            for name, spec in specs.items()
        ]
        buckets = ", ".join(f"{bucket:g}" for bucket in metrics.LAG_BUCKETS)
        note = nodes.paragraph()
        note.extend([nodes.Text("Histogram buckets (seconds): "), *_code(buckets), nodes.Text(".")])
        return [_table(["Metric", "Type", "Labels", "Help"], rows, [34, 10, 12, 44]), note]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the mounted API serves, generated from the views."""
    from django.test import Client

    response = Client().get("/scheduler/api/schema/", {"format": "json"})
    if response.status_code != 200:
        raise RuntimeError(f"schema/ answered {response.status_code}")
    document: dict[str, Any] = json.loads(response.content)
    return document


# drf-spectacular lists an enum's values as "* `A` - A" lines; the type column shows them.
_ENUM_LINES = re.compile(r"^\* `[^`]*` - .*$\n?", re.MULTILINE)


def _schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any]) -> list[nodes.Node]:
    """A schema as a short type: a link to a named schema, ``array of X``, an enum's values."""
    if "$ref" in schema:
        name = _schema_name(schema["$ref"])
        return [nodes.reference(name, name, refid=f"schema-{name.lower()}")]
    if len(schema.get("allOf", [])) == 1:
        return _type(schema["allOf"][0])
    # A nullable choice: oneOf its enum and NullEnum (drf-spectacular's spelling).
    choices = [s for s in schema.get("oneOf", []) if s.get("$ref", "").split("/")[-1] != "NullEnum"]
    if len(choices) == 1:
        return [*_type(choices[0]), *([nodes.Text(" or null")] if schema.get("nullable") else [])]
    if schema.get("type") == "array":
        return [nodes.Text("array of "), *_type(schema.get("items", {}))]
    if "enum" in schema:
        return [nodes.Text("one of "), *_code(", ".join(map(str, schema["enum"])))]
    kind = str(schema.get("type", "object"))
    if "format" in schema:
        kind += f" ({schema['format']})"
    if schema.get("nullable"):
        kind += " or null"
    return [nodes.Text(kind)]


def _text(description: str) -> list[nodes.Node]:
    return _inline(" ".join(_ENUM_LINES.sub("", description or "").split()))


class OpenAPIDirective(SphinxDirective):
    """Every operation of the HTTP API and every schema it uses, from the OpenAPI document."""

    option_spec = {"prefix": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from django_app.http import serializers, views

        self.env.note_dependency(views.__file__)
        self.env.note_dependency(serializers.__file__)
        document = openapi_document()
        prefix = self.options.get("prefix", "")
        link = nodes.paragraph()
        target = "../" * self.env.docname.count("/") + "openapi.json"
        link.extend(
            [
                nodes.Text(f"OpenAPI {document['openapi']} document of this version: "),
                nodes.reference("openapi.json", "openapi.json", refuri=target),
                nodes.Text(" (the API serves the same at "),
                *_code(prefix + "schema/?format=json"),
                nodes.Text("). Paths are shown under the example project's mount, "),
                *_code(prefix),
                nodes.Text("."),
            ]
        )
        result: list[nodes.Node] = [link]
        summary_rows = []
        details: list[nodes.Node] = []
        for path, item in document["paths"].items():
            for method, operation in item.items():
                if method not in {"get", "post", "put", "patch", "delete"}:
                    continue
                title = f"{method.upper()} {path}"
                anchor = "op-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
                summary_rows.append(
                    [
                        [nodes.reference(title, "", nodes.literal(title, title), refid=anchor)],
                        _inline(operation.get("summary", "")),
                    ]
                )
                details.extend(self._operation(title, anchor, operation))
        result.append(_table(["Operation", "Summary"], summary_rows, [40, 60]))
        result.extend(details)
        result.append(nodes.rubric(text="Schemas"))
        for name, schema in document.get("components", {}).get("schemas", {}).items():
            result.extend(self._schema(name, schema))
        return result

    def _operation(self, title: str, anchor: str, operation: dict[str, Any]) -> list[nodes.Node]:
        out: list[nodes.Node] = [nodes.rubric(text=title, ids=[anchor])]
        description = operation.get("description") or operation.get("summary", "")
        for paragraph_text in description.split("\n\n"):
            if paragraph_text.strip():
                paragraph = nodes.paragraph()
                paragraph.extend(_text(paragraph_text))
                out.append(paragraph)
        items = nodes.bullet_list()
        for parameter in operation.get("parameters", []):
            required = ", required" if parameter.get("required") else ""
            items += _item(
                [
                    *_code(parameter["name"]),
                    nodes.Text(f" ({parameter['in']}{required}): "),
                    *_type(parameter.get("schema", {})),
                    nodes.Text(". "),
                    *_text(parameter.get("description", "")),
                ]
            )
        body = operation.get("requestBody", {}).get("content", {})
        for media, content in body.items():
            schema = content.get("schema", {})
            items += _item(
                [nodes.Text("request body ("), *_code(media), nodes.Text("): "), *_type(schema)]
            )
        for status, response in operation.get("responses", {}).items():
            answer: list[nodes.Node] = [*_code(status), nodes.Text(" ")]
            answer += _text(response.get("description", ""))
            for content in response.get("content", {}).values():
                answer += [nodes.Text(" "), *_type(content.get("schema", {}))]
            items += _item(answer)
        if len(items):
            out.append(items)
        return out

    def _schema(self, name: str, schema: dict[str, Any]) -> list[nodes.Node]:
        out: list[nodes.Node] = [nodes.rubric(text=name, ids=[f"schema-{name.lower()}"])]
        if schema.get("description"):
            paragraph = nodes.paragraph()
            paragraph.extend(_text(schema["description"]))
            out.append(paragraph)
        properties = schema.get("properties", {})
        if not properties:
            paragraph = nodes.paragraph()
            paragraph.extend(_type({k: v for k, v in schema.items() if k != "description"}))
            out.append(paragraph)
            return out
        required = set(schema.get("required", []))
        rows = [
            [
                _code(prop),
                _type(spec),
                [nodes.Text("yes" if prop in required else "")],
                _text(spec.get("description", "")),
            ]
            for prop, spec in properties.items()
        ]
        out.append(_table(["Field", "Type", "Required", "Description"], rows, [20, 25, 8, 47]))
        return out


def _item(content: list[nodes.Node]) -> nodes.list_item:
    item = nodes.list_item()
    paragraph = nodes.paragraph()
    paragraph.extend(content)
    item += paragraph
    return item


def _write_openapi(app: Sphinx, exception: Exception | None) -> None:
    """Write the generated document beside the pages (the reference page links to it)."""
    if exception is None and app.builder.format == "html":
        path = Path(app.outdir) / "openapi.json"
        path.write_text(json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("scheduler-settings", SettingsDirective)
    app.add_directive("scheduler-command", CommandDirective)
    app.add_directive("scheduler-metrics", MetricsDirective)
    app.add_directive("scheduler-openapi", OpenAPIDirective)
    app.connect("env-check-consistency", _check_commands)
    app.connect("build-finished", _write_openapi)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
