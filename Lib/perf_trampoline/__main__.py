import sys

from perf_trampoline import main

sys.exit(main())
