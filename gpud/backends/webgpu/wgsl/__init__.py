"""WGSL reflection in pure Python: which bindings a kernel may write, and its interface, without compiling it.

`reflect.reflect(source)` is the entry point and says what is read and what is not; `model` holds what it
returns. The passes: `lexer` (tokens, comments, the problems found), `parser` (module-scope declarations
as token ranges), `consts` (integer const expressions), `resolver` (the resource variables and structs).
Every module of this package uses the standard library only.
"""
