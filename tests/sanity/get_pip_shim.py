"""Stand-in for get-pip.py, which ansible-test --venv downloads from a host that is not reachable here.

ansible-test calls it as ``python get_pip.py [pip options] pip==X [--no-setuptools] [--no-wheel]``
inside a fresh venv: ensurepip gives that venv a pip, which then installs what was asked from the
package index. scripts/bootstrap copies this file into ansible-test's cache.
"""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], stdout=subprocess.DEVNULL)
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
