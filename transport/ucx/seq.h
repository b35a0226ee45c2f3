/*
 * The ucx provider's 24-bit sequence numbers (the short header of
 * ucx_send_inline, ucx.c): a receiver widens one to 32 bits as the number
 * nearest its stream's next one. Apart so that a unit test can reach the
 * wrap-arounds no run of messages in CI would.
 */
#ifndef TERN_UCX_SEQ_H
#define TERN_UCX_SEQ_H

#include <stdint.h>

/* The 32-bit seq whose low 24 bits are low24 and which lies nearest next:
 * exact while the true seq is less than 2^23 before or after it. */
static inline uint32_t tern__ucx_seq_near(uint32_t next, uint32_t low24)
{
    uint32_t d = (low24 - next) & 0xffffffu; /* forward distance, mod 2^24 */
    return d & 0x800000u ? next - (0x1000000u - d) : next + d;
}

#endif
