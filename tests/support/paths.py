"""Where the tests find the repository: its root folder and its three training scripts."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("dpo_humanline.py", "kto_humanline.py", "grpo_humanline.py")
