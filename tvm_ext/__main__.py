import sys

from tvm_ext.cli import main

sys.exit(main())
