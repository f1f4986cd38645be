"""The example range job as a user's project: a job module (`cm_data`), its table and its
create step (`tables`), and a seeder (`python -m examples.seed`). It stands outside the
platform's packages and reaches workers the way the README tells users to load their own jobs:
`EXTRA_TASK_MODULES=examples.cm_data`."""
