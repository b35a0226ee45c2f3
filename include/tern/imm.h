/*
 * The 32-bit immediate every message carries (DESIGN.md). It tells the target
 * which layer owns the message and, for RPC, whether the caller is profiled,
 * without parsing a payload:
 *
 *   31..28  class     p2p eager / p2p rendezvous / coll / rpc request / rpc reply / control
 *   27      prof      the caller's profiler is on: profile this request, return events
 *   26..24  prof cfg  memory / shapes / cuda
 *   23..0   slot      request slot or sequence number
 *
 * This is the only place the layout is written down in code.
 */
#ifndef TERN_IMM_H
#define TERN_IMM_H

#include <stdint.h>

#include <tern/defs.h>

TERN_BEGIN_DECLS

/* Class 0 is never sent, so an all-zero immediate is always a bug caught at the target. */
typedef enum tern_imm_class {
    TERN_IMM_P2P_EAGER = 1,
    TERN_IMM_P2P_RNDV = 2,
    TERN_IMM_COLL = 3,
    TERN_IMM_RPC_REQUEST = 4,
    TERN_IMM_RPC_REPLY = 5,
    TERN_IMM_CONTROL = 6,
} tern_imm_class_t;

#define TERN_IMM_CLASS_SHIFT 28
#define TERN_IMM_CLASS_MASK 0xfu
#define TERN_IMM_PROF (1u << 27)
#define TERN_IMM_PROF_CFG_SHIFT 24
#define TERN_IMM_PROF_CFG_MASK 0x7u
#define TERN_IMM_PROF_MEMORY (1u << 0) /* prof cfg bits, before shifting */
#define TERN_IMM_PROF_SHAPES (1u << 1)
#define TERN_IMM_PROF_CUDA (1u << 2)
#define TERN_IMM_SLOT_BITS 24
#define TERN_IMM_SLOT_MASK 0xffffffu

/* Build an immediate. Out-of-range fields are masked to their width. */
static inline uint32_t tern_imm_make(tern_imm_class_t cls, int prof, uint32_t prof_cfg,
                                     uint32_t slot)
{
    return ((uint32_t)cls & TERN_IMM_CLASS_MASK) << TERN_IMM_CLASS_SHIFT |
           (prof ? TERN_IMM_PROF : 0u) |
           (prof_cfg & TERN_IMM_PROF_CFG_MASK) << TERN_IMM_PROF_CFG_SHIFT |
           (slot & TERN_IMM_SLOT_MASK);
}

static inline tern_imm_class_t tern_imm_class(uint32_t imm)
{
    return (tern_imm_class_t)(imm >> TERN_IMM_CLASS_SHIFT & TERN_IMM_CLASS_MASK);
}

static inline int tern_imm_prof(uint32_t imm)
{
    return (imm & TERN_IMM_PROF) != 0;
}

static inline uint32_t tern_imm_prof_cfg(uint32_t imm)
{
    return imm >> TERN_IMM_PROF_CFG_SHIFT & TERN_IMM_PROF_CFG_MASK;
}

static inline uint32_t tern_imm_slot(uint32_t imm)
{
    return imm & TERN_IMM_SLOT_MASK;
}

TERN_END_DECLS

#endif
