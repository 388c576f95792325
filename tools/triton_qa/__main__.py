import sys

from tools.triton_qa.run import main

sys.exit(main())
