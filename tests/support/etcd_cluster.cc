#include "tests/support/etcd_cluster.h"
