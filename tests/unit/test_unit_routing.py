"""A unit's control knows every role's operations without importing a native library (it runs
none: ADR 0046); the profile check itself runs on real Postgres in tests/e2e/test_worker_unit.py."""

from __future__ import annotations

import subprocess
import sys

from hypermedia.engines.documents import params as documents
from hypermedia.engines.imaging import ops
from hypermedia.engines.media import params as media
from hypermedia.engines.ocr import params as ocr
from hypermedia.worker.unit import routing
from hypermedia.worker.unit.settings import ROLES


def test_each_role_handles_its_engines_operations_and_noop() -> None:
    handled = {name: routing.handled_operations(role.operations) for name, role in ROLES.items()}
    assert handled == {
        "imageworker": {*ops.OPERATIONS, "noop"},
        "docworker": {*documents.OPERATIONS, "noop"},
        "ocrworker": {*ocr.OPERATIONS, "noop"},
        "mediaworker": {*media.OPERATIONS, "noop"},
    }


def test_control_and_the_routing_check_import_no_native_library() -> None:
    script = (
        "import sys\n"
        "import hypermedia.worker.unit.control\n"
        "from hypermedia.worker.unit import routing\n"
        "from hypermedia.worker.unit.settings import ROLES\n"
        "[routing.handled_operations(r.operations) for r in ROLES.values()]\n"
        "print(sorted(m for m in ('pyvips', 'av', 'pypdfium2', 'cv2', 'PIL', 'onnxruntime') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
