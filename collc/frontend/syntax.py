"""The error for .coll text that does not follow the grammar: raised by the parser
(`collc.frontend.parser`) and by the transformer from Lark's tree to the AST
(`collc.frontend.to_ast`), which the parser loads only when it parses text."""

from __future__ import annotations

from collc.diagnostics import CollcError


class CollSyntaxError(CollcError):
    """Source text that does not follow the .coll grammar."""
