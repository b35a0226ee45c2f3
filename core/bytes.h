/*
 * Reading and writing integers at a byte position in a buffer, in an explicit
 * byte order: every wire format in tern (the store's frames, tcp frames and
 * keys, p2p headers, ucx headers, the tensor wire form) goes through these, so
 * no struct is ever copied to the wire and a misaligned field is never loaded
 * as a word.
 */
#ifndef TERN_CORE_BYTES_H
#define TERN_CORE_BYTES_H

#include <stdint.h>
#include <string.h>

/* On a little-endian host a field is one (unaligned) load or store: GCC 12
 * does not merge the byte-wise form and spent some 40 instructions building
 * each pair of words of a p2p header from shifts (callgrind). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define TERN__LE_HOST 1
#else
#define TERN__LE_HOST 0
#endif

static inline void tern__put_le16(uint8_t *p, uint16_t v)
{
    if (TERN__LE_HOST) {
        memcpy(p, &v, sizeof(v));
        return;
    }
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void tern__put_le32(uint8_t *p, uint32_t v)
{
    if (TERN__LE_HOST) {
        memcpy(p, &v, sizeof(v));
        return;
    }
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tern__put_le64(uint8_t *p, uint64_t v)
{
    if (TERN__LE_HOST) {
        memcpy(p, &v, sizeof(v));
        return;
    }
    tern__put_le32(p, (uint32_t)v);
    tern__put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t tern__get_le16(const uint8_t *p)
{
    if (TERN__LE_HOST) {
        uint16_t v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t tern__get_le32(const uint8_t *p)
{
    if (TERN__LE_HOST) {
        uint32_t v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t tern__get_le64(const uint8_t *p)
{
    if (TERN__LE_HOST) {
        uint64_t v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    return (uint64_t)tern__get_le32(p) | (uint64_t)tern__get_le32(p + 4) << 32;
}

static inline void tern__put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void tern__put_be64(uint8_t *p, uint64_t v)
{
    tern__put_be32(p, (uint32_t)(v >> 32));
    tern__put_be32(p + 4, (uint32_t)v);
}

static inline uint32_t tern__get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t tern__get_be64(const uint8_t *p)
{
    return (uint64_t)tern__get_be32(p) << 32 | tern__get_be32(p + 4);
}

/* FNV-1a over len bytes, continuing from h (TERN__FNV_SEED to start): a
 * checksum or signature of wire bytes, the same on every host. */
#define TERN__FNV_SEED 2166136261u

static inline uint32_t tern__fnv1a(uint32_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

#endif
