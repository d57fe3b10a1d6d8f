import sys

from amptrain.cli import main

sys.exit(main())
