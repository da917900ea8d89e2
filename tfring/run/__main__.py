import sys

from tfring.run.launcher import main

sys.exit(main())
