"""WGSL's tokens: comments and blankspace dropped, characters that are not WGSL reported, offsets on demand."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable

_MAX_PROBLEMS = 20

_PUNCT = "-&|@/![]{}:,=<>%.+()*;~^"
_NOT_IDENT_START = frozenset(_PUNCT + "0123456789")
OPENERS = frozenset("([")
CLOSERS = frozenset(")]")

# WGSL's blankspace and line breaks (Unicode Pattern_White_Space), and its one-character punctuation
_BLANKS = "\t\n\x0b\x0c\r \x85\u200e\u200f\u2028\u2029"
_LINE_BREAKS = "\n\x0b\x0c\r\x85\u2028\u2029"
_PUNCT_CLASS = re.escape(_PUNCT)
_TOKEN = (
    rf"[{re.escape(_PUNCT.replace('.', ''))}]"  # punctuation, except "." which may start a number
    r"|[^\W\d]\w*"  # identifiers (checked against XID where the source is not ASCII)
    r"|0[xX][0-9a-fA-F]*(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?[0-9]+)?[fhiu]?"  # numbers, valid or not
    r"|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?[fhiu]?"
    r"|\.[0-9]+(?:[eE][+-]?[0-9]+)?[fh]?"
    r"|\."
    rf"|[^{_BLANKS}\w{_PUNCT_CLASS}]+"  # runs of characters that are not WGSL
    r"|."
)
# A match starts at every position of a comment-free stretch of source (the last alternatives take any character, and
# \Z the trailing blankspace), so `findall` never rescans: it runs in linear time.
_TOKEN_RE = re.compile(rf"[{_BLANKS}]*({_TOKEN}|\Z)", re.DOTALL)
_RAW_TOKEN_RE = re.compile(rf"[{_BLANKS}]*(?:{_TOKEN}|\Z)", re.DOTALL)  # the same, blankspace included
_COMMENT_RE = re.compile(rf"//[^{_LINE_BREAKS}]*|/\*")
_BLOCK_RE = re.compile(r"/\*|\*/")
_NOT_WGSL_RE = re.compile(rf"[^{_BLANKS}\w{_PUNCT_CLASS}]")
_NON_ASCII_RE = re.compile(r"[^\x00-\x7f]")
_IDENT_START_RE = re.compile(r"[^\W\d]")


class Tokens:
    """The tokens of a module (comments and blankspace dropped), with their offsets computed on demand."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.toks: list[str] = []
        self.segments: list[tuple[int, int, int]] = []  # comment-free stretches: (start, end, index of first token)
        self._firsts: list[int] = []
        self._ends: dict[int, list[int]] = {}  # segment -> cumulative lengths of its raw matches

    def add_segment(self, start: int, end: int) -> int:
        """Tokenise source[start:end]; the index of its first token."""
        toks = self.toks
        first = len(toks)
        toks.extend(_TOKEN_RE.findall(self.source, start, end))
        while len(toks) > first and not toks[-1]:
            toks.pop()
        self.segments.append((start, end, first))
        self._firsts.append(first)
        return first

    def offset(self, index: int) -> int:
        """The offset in the source of token `index` (the end of the source for an index past the last token)."""
        if index >= len(self.toks) or not self.segments:
            return len(self.source)
        k = bisect.bisect_right(self._firsts, index) - 1
        start, end, first = self.segments[k]
        ends = self._ends.get(k)
        if ends is None:
            ends = self._ends[k] = list(itertools.accumulate(map(len, _RAW_TOKEN_RE.findall(self.source, start, end))))
        return start + ends[index - first] - len(self.toks[index])


class Problems:
    """Reasons for inexactness, with line numbers; only the first few are kept in full."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens
        self.items: list[str] = []
        self.dropped = 0

    def add(self, offset: int | None, message: str) -> None:
        if len(self.items) >= _MAX_PROBLEMS:
            self.dropped += 1
            return
        if offset is not None:
            message = f"line {self.tokens.source.count(chr(10), 0, offset) + 1}: {message}"
        self.items.append(message)

    def at(self, index: int, message: str) -> None:
        """A problem at token `index`."""
        self.add(self.tokens.offset(index) if len(self.items) < _MAX_PROBLEMS else None, message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def result(self) -> tuple[str, ...]:
        if self.dropped:
            return (*self.items, f"... and {self.dropped} more")
        return tuple(self.items)


def tokenize(source: str) -> tuple[Tokens, Problems]:
    """Split `source` at its comments, then each comment-free stretch into tokens."""
    tokens = Tokens(source)
    problems = Problems(tokens)
    pos, end = 0, len(source)
    while True:
        comment = _COMMENT_RE.search(source, pos)
        stop = end if comment is None else comment.start()
        first = tokens.add_segment(pos, stop)
        bad = _NOT_WGSL_RE.search(source, pos, stop)
        if bad is not None:
            problems.add(bad.start(), f"{show(bad.group())} is not WGSL")
        if _NON_ASCII_RE.search(source, pos, stop) is not None:
            for index in range(first, len(tokens.toks)):
                tok = tokens.toks[index]
                if _IDENT_START_RE.match(tok) and not tok.isidentifier():
                    problems.at(index, f"{show(tok)} is not a WGSL identifier")
        if comment is None:
            return tokens, problems
        pos = comment.end()
        if source[comment.start() + 1] == "/":
            continue
        depth = 1  # a block comment: they nest
        while depth:
            close = _BLOCK_RE.search(source, pos)
            if close is None:
                problems.add(comment.start(), "unterminated block comment")
                return tokens, problems
            pos = close.end()
            depth += 1 if source[close.start()] == "/" else -1


def show(tok: str) -> str:
    """A token for a message: quoted, and shortened when long."""
    return repr(tok) if len(tok) <= 40 else repr(tok[:40]) + "..."


def is_ident(tok: str) -> bool:
    return bool(tok) and tok[0] not in _NOT_IDENT_START


def type_text(tokens: Iterable[str]) -> str:
    """Whitespace-normalised text of a type: tokens joined without spaces, one space after each comma."""
    return "".join(", " if t == "," else t for t in tokens).strip()
