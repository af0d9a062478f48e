"""``python omni_launch.py serve|run …``: the ``omni`` command with the test plugin registered.

The serve tests run ``omni`` as a real subprocess (signals, exit codes,
children); this registers :mod:`omni_test_speech` in-process first, and the
runtime hands it to its children by module name.
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # (spawned children import this file as __mp_main__)
    sys.path.insert(0, str(Path(__file__).parent))
    import omni_test_speech

    from omni_core.cli import main
    from omni_core.plugins import get_plugins

    get_plugins().register(omni_test_speech, omni_test_speech.HERE)
    sys.exit(main(sys.argv[1:]))
