"""Studies: the whole RQ1-RQ3 experiment (record, replay, diff, fine-tune, report) from one file.

`study_file` reads and validates a study file (`load_study`, `shipped_studies`), `runner` runs one
(`run_study`), `fleet_study` a fleet study, `folders` says what their folders may hold; import each from its
module (this package imports none of them, so `sdc --help` does not pay for what a study runs).
"""
