"""`python -m t5x_like.plan`: the planner's CLI (`t5x_like.plan.main`)."""

import sys

from t5x_like.plan import main

sys.exit(main())
