"""``dflash-console demo [--headless] [--dir DIR] [--port N]``: the whole system on this machine.

The demo is built on the console, never the reverse: it drives a Session like any caller and shows
the ordinary operator screen (console/app.py) through its Extension points; it imports no Textual.
Modules: demo.py (the Demo: directory, host, tiny assets, deploy, launch, shutdown), processes.py
(the processes it started), headless.py (``--headless``), screen.py (the screen's additions),
main.py (``run``).

What runs, all on this machine and all ended when the demo ends:
- a DevHost (console/devhost): an asyncssh server on 127.0.0.1 with fresh keys (its known_hosts
  line written, host keys checked, only the demo's own client key accepted) whose ``pct`` stand-in
  plays container 200 as the folder ``DIR/host/ct/200``;
- the tiny target and data set, built once by ``python -m trainer.tiny`` in a subprocess (the
  console never imports torch);
- the bundled trainer, deployed and launched in the container through the console's own path
  (``Session.deploy``, ``Session.launch``), on CPU with one thread a role;
- the operator screen on a Session to that host; with ``--headless``, a status line a second.

Quitting (``q`` in the screen, Ctrl-C, SIGTERM) stops the trainer cleanly (SIGINT: checkpoint,
exit), closes the host and ends every process the demo started: they all carry the environment
variable ``DFLASH_DEMO=<token>``, and whatever still does at the end is ended. With ``--dir DIR``
the files stay and a rerun resumes the run from its last checkpoint; a temp dir is removed.
"""

from console.demo.demo import Demo, DemoError
from console.demo.main import run
from console.demo.processes import end_marked, marked_processes

__all__ = ["Demo", "DemoError", "end_marked", "marked_processes", "run"]
