"""The log files of a run: every rank's rank<N>.log (ringexp.launch) and Hydra's own train.log
(conf/hydra/job_logging/ringexp.yaml), appended to without following a symlink at their names."""

import logging

from ringexp import records


class FileHandler(logging.FileHandler):
    """logging.FileHandler whose file is opened by records.open_append: a symlink planted at the name is an OSError
    naming it (logging's own open would append to wherever it points), a FIFO is refused rather than waited on.
    Always appends (a run resumed in its directory continues its logs)."""

    def _open(self):
        return records.open_append(self.baseFilename)
