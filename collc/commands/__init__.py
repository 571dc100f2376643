"""The `collc` commands: one module per command, each with `add_commands(subparsers)`.

A command's `func` returns an exit status and raises `CollcError` (exit 1) or
`UsageError` (exit 2); `collc.cli` builds the parser from every command module and runs
the one chosen. Shared here: argument types (`args`), printing (`printing`), the policy
for `-o` paths (`output_paths`) and the compile report table (`report_table`).

Command modules import the compiler (front end, driver, backends) inside the command
functions: `collc --help` builds every parser, and should not load the solver to do it.
"""
