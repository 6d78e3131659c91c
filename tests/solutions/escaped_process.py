"""Correct, but starts a process in a session of its own (start_new_session=True) that would
outlive the evaluation: killing the child's process group misses it. Its pid goes to the file
named by LOSSLAB_TEST_PID_FILE, for the test to look for it afterwards."""
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open(os.environ["LOSSLAB_TEST_PID_FILE"], "w") as out:
    out.write(str(sleeper.pid))


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
