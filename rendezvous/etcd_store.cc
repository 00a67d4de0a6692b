// Filled in by the etcd client work (issue 15).
#include "rendezvous/etcd_store.h"
