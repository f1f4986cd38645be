"""`python -m tasks` (and the `rangekeeper` script): the operator CLI, one click group with a
module per concern.

    migrate, status              tasks.cli.core
    jobs <verb> JOB ...          tasks.cli.jobs         (range-job controls and run history)
    deadletters <verb> ...       tasks.cli.deadletters  (list, show, replay, purge)
    console                      tasks.cli.console      (serves tasks.console)

`tasks.cli.main` puts them on the group and runs it; `tasks.cli.render` draws the wings' plain
status views as rich tables (the one module of the CLI that builds a table), in layouts
`tasks.cli.fit` chooses for the terminal's width, with values written by `tasks.cli.words`
(yes/no, "-", zoned times, spoken durations). Every `--json` is one envelope
(`tasks.cli.common.envelope`). Each command gets
the process's `Resources` through `tasks.cli.common.open_resources()`, which turns a database
that is missing or does not answer into one clear line on stderr and exit code 1. Like
`tasks.__main__` this package sits above the wings: it may import every wing, and nothing
below imports it (the console neither). This face does no work: import the module you need.
"""
