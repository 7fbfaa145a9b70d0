"""The lab's own TrainingArguments does not warn about the lab's own process group (a workshop server's log, issue 58)."""

import logging

from ckptlab.model.libraries import lab_own_training_arguments

WARNING = (
    "torch.distributed process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED. "
    "In order to use Torch DDP, launch your script with `python -m torch.distributed.launch"
)


def test_only_the_labs_own_arguments_are_quiet_about_the_process_group(caplog):
    logger = logging.getLogger("transformers.training_args")  # the logger transformers' TrainingArguments warns on
    with caplog.at_level(logging.WARNING, logger="transformers.training_args"):
        with lab_own_training_arguments():
            logger.warning(WARNING)
            logger.warning("another warning of TrainingArguments")
        logger.warning(WARNING)  # a user's own TrainingArguments, after the lab's
    assert [r.getMessage() for r in caplog.records] == ["another warning of TrainingArguments", WARNING]
