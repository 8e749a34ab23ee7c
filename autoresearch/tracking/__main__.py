import sys

from autoresearch.tracking._daemon import main

sys.exit(main())
