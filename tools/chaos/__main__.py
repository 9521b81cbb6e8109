import sys

from tools.chaos.run import main

sys.exit(main())
