"""The operator console: `python -m tasks console` serves a small web app (Tornado).

    jobs          one row per range job: run state, progress, rows/s, ETA, throttle
    jobs/JOB      a bar per partition, the run history, and the controls (start, pause,
                  resume, cancel, retry-failed, throttle)
    restock       every stock node: term, maintenance window, queues, due, unsynced log
    deadletters   list, filter by kind, show, replay, purge

It shows and does what the CLI does, with the same code (`tasks.console.actions` is the one
module that calls into the platform; it serialises the wings' plain status views and never
imports the CLI). `tasks.console.server` builds the app (`make_app`) and serves it (`serve`);
this face does no work. Like the CLI it sits above the wings. It refuses to
start without CONSOLE_USER and CONSOLE_PASSWORD or with a password or secret shipped in this
repository, binds 127.0.0.1 unless CONSOLE_ADDRESS says otherwise, limits failed logins per
user and per address (`tasks.console.logins`), keeps sessions on the server
(`tasks.console.sessions`), and every state-changing request needs the CSRF token issued at
login (`tasks.console.auth`) and the operator role (`tasks.console.roles`; a viewer reads
only). Behind oauth2-proxy it signs in the user a trusted proxy names (`tasks.console.sso`).
"""
