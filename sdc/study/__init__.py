"""Studies: the whole RQ1-RQ3 experiment (record, replay, diff, fine-tune, report) from one file."""

from sdc.study.study_file import Study, load_study, shipped_studies
from sdc.study.runner import StudyResult, run_study

__all__ = ["Study", "StudyResult", "load_study", "run_study", "shipped_studies"]
