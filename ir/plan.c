/* Execution plans: storage (being written). */
#include "plan.h"
