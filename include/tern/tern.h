/* tern: tensors between processes at RDMA speed. Include this one header. */
#ifndef TERN_TERN_H
#define TERN_TERN_H

#include <tern/build_config.h>
#include <tern/clock.h>
#include <tern/coll.h>
#include <tern/context.h>
#include <tern/defs.h>
#include <tern/env.h>
#include <tern/imm.h>
#include <tern/log.h>
#include <tern/p2p.h>
#include <tern/pool.h>
#include <tern/prof.h>
#include <tern/rpc.h>
#include <tern/status.h>
#include <tern/store.h>
#include <tern/tensor.h>
#include <tern/transport.h>

#endif
