/* The store's table: a uthash map from key to bytes, and the job's membership. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"

#include "core/error.h"
#include "core/kv.h"

typedef struct entry {
    UT_hash_handle hh;
    char *key;
    void *value;
    size_t len;
} entry_t;

struct tern__kv {
    entry_t *map;
    unsigned world_size;
    unsigned members;
    bool *joined; /* [world_size] */
};

tern__kv_t *tern__kv_create(unsigned world_size)
{
    tern__kv_t *kv = calloc(1, sizeof(*kv));
    if (kv == NULL)
        return NULL;
    kv->world_size = world_size;
    kv->joined = calloc(world_size ? world_size : 1, sizeof(bool));
    if (kv->joined == NULL) {
        free(kv);
        return NULL;
    }
    return kv;
}

void tern__kv_destroy(tern__kv_t *kv)
{
    entry_t *e, *tmp;
    if (kv == NULL)
        return;
    HASH_ITER(hh, kv->map, e, tmp) {
        HASH_DEL(kv->map, e);
        free(e->key);
        free(e->value);
        free(e);
    }
    free(kv->joined);
    free(kv);
}

tern_status_t tern__kv_set(tern__kv_t *kv, const char *key, const void *value, size_t len)
{
    entry_t *e;
    /* +1 keeps every value NUL-terminated, which add's integer parse relies on. */
    void *copy = malloc(len + 1);

    if (copy == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "store: no memory for a %zu-byte value", len);
    if (len > 0)
        memcpy(copy, value, len);
    ((char *)copy)[len] = '\0';

    HASH_FIND_STR(kv->map, key, e);
    if (e == NULL) {
        e = calloc(1, sizeof(*e));
        if (e == NULL || (e->key = strdup(key)) == NULL) {
            free(e);
            free(copy);
            return tern__error(TERN_ERR_NO_MEMORY, "store: no memory for key '%s'", key);
        }
        tern__hash_oom = false;
        HASH_ADD_KEYPTR(hh, kv->map, e->key, strlen(e->key), e);
        if (tern__hash_oom) {
            free(e->key);
            free(e);
            free(copy);
            return tern__error(TERN_ERR_NO_MEMORY, "store: no memory to index key '%s'", key);
        }
    }
    free(e->value);
    e->value = copy;
    e->len = len;
    return TERN_OK;
}

const void *tern__kv_peek(const tern__kv_t *kv, const char *key, size_t *len)
{
    entry_t *e;
    HASH_FIND_STR(kv->map, key, e);
    if (e == NULL)
        return NULL;
    if (len != NULL)
        *len = e->len;
    return e->value;
}

tern_status_t tern__kv_add(tern__kv_t *kv, const char *key, int64_t delta, int64_t *result)
{
    size_t len;
    const char *cur = tern__kv_peek(kv, key, &len);
    int64_t v = 0;
    char buf[32];

    if (cur != NULL) {
        char *end;
        errno = 0;
        long long parsed = strtoll(cur, &end, 10);
        if (len == 0 || errno != 0 || end != cur + len)
            return tern__error(TERN_ERR_INVALID_PARAM, "store: add to '%s', which holds a non-integer",
                               key);
        v = parsed;
    }
    if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta))
        return tern__error(TERN_ERR_OUT_OF_RANGE, "store: add %" PRId64 " to '%s' overflows", delta,
                           key);
    v += delta;
    int n = snprintf(buf, sizeof(buf), "%" PRId64, v);
    tern_status_t st = tern__kv_set(kv, key, buf, (size_t)n);
    if (st == TERN_OK && result != NULL)
        *result = v;
    return st;
}

/* What a HELLO of either kind says of itself, checked against this world. */
static tern_status_t check_rank(const tern__kv_t *kv, unsigned rank, unsigned world_size)
{
    if (world_size != kv->world_size)
        return tern__error(TERN_ERR_MISMATCH,
                           "world size mismatch: rank %u says %u ranks, the store (rank 0) serves %u",
                           rank, world_size, kv->world_size);
    if (rank >= kv->world_size)
        return tern__error(TERN_ERR_INVALID_PARAM, "rank %u is out of range for a world of %u", rank,
                           kv->world_size);
    return TERN_OK;
}

tern_status_t tern__kv_join(tern__kv_t *kv, unsigned rank, unsigned world_size)
{
    tern_status_t st = check_rank(kv, rank, world_size);
    if (st != TERN_OK)
        return st;
    if (kv->joined[rank])
        return tern__error(TERN_ERR_MISMATCH,
                           "duplicate rank: rank %u is already connected to the store", rank);
    kv->joined[rank] = true;
    kv->members++;
    return TERN_OK;
}

tern_status_t tern__kv_check_member(const tern__kv_t *kv, unsigned rank, unsigned world_size)
{
    tern_status_t st = check_rank(kv, rank, world_size);
    if (st != TERN_OK)
        return st;
    if (!kv->joined[rank])
        return tern__error(TERN_ERR_MISMATCH,
                           "a further connection of rank %u, which is not connected to the store",
                           rank);
    return TERN_OK;
}

void tern__kv_leave(tern__kv_t *kv, unsigned rank)
{
    if (rank < kv->world_size && kv->joined[rank]) {
        kv->joined[rank] = false;
        kv->members--;
    }
}

unsigned tern__kv_members(const tern__kv_t *kv)
{
    return kv->members;
}

tern_status_t tern__kv_copy(const void *value, size_t len, void **out, size_t *out_len)
{
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "store: no memory for a %zu-byte value", len);
    if (len > 0)
        memcpy(copy, value, len);
    copy[len] = '\0';
    *out = copy;
    if (out_len != NULL)
        *out_len = len;
    return TERN_OK;
}
