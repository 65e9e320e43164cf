import sys

from stockade.supervisor.cli.main import main

sys.exit(main())
