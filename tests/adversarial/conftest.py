"""The adversarial suite shares the CLI helpers of the main test directory."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: run_helpers
