/*
 * The process-wide registry of RPC functions and classes. Entries are never
 * removed, and each lives at a fixed address, so a lookup's result stays
 * valid without the lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "rpc/builtins.h"
#include "rpc/rpc_int.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static tern__rpc_entry_t **entries;
static size_t nentries, capacity;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;
static tern_status_t builtins_status;
/* Set while the built-ins register themselves (through tern_rpc_register). */
static _Thread_local bool in_builtins;

bool tern__rpc_name_ok(const char *name, size_t len, bool dotted)
{
    if (len == 0 || len > TERN_RPC_NAME_MAX)
        return false;
    int dots = 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
        if (c == '.' && dotted && i > 0 && i + 1 < len && dots++ == 0)
            ok = true;
        if (!ok)
            return false;
    }
    return true;
}

static tern__rpc_entry_t *find_locked(const char *name, size_t len)
{
    for (size_t i = 0; i < nentries; i++)
        if (strlen(entries[i]->name) == len && memcmp(entries[i]->name, name, len) == 0)
            return entries[i];
    return NULL;
}

static tern_status_t add(const char *name, tern_rpc_fn fn, tern_rpc_ctor ctor, tern_rpc_dtor dtor)
{
    size_t len = name != NULL ? strlen(name) : 0;
    if (!tern__rpc_name_ok(name, len, ctor == NULL))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "tern_rpc_register: bad name '%s' (letters, digits, '_', '-'%s; 1 to "
                           "%d characters)",
                           name ? name : "(null)", ctor == NULL ? ", one inner '.'" : "",
                           TERN_RPC_NAME_MAX);
    if ((fn == NULL) == (ctor == NULL))
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_register: '%s' needs a function",
                           name);
    tern_status_t st = TERN_OK;
    pthread_mutex_lock(&reg_lock);
    tern__rpc_entry_t *e = find_locked(name, len);
    if (e != NULL) {
        if (e->fn != fn || e->ctor != ctor || e->dtor != dtor)
            st = tern__error(TERN_ERR_MISMATCH, "tern_rpc_register: '%s' is already registered "
                                                "as something else",
                             name);
        goto out;
    }
    if (nentries == capacity) {
        size_t cap = capacity ? capacity * 2 : 32;
        tern__rpc_entry_t **n = realloc(entries, cap * sizeof(*n));
        if (n == NULL) {
            st = tern__error(TERN_ERR_NO_MEMORY, "tern_rpc_register: out of memory");
            goto out;
        }
        entries = n;
        capacity = cap;
    }
    if ((e = calloc(1, sizeof(*e))) == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "tern_rpc_register: out of memory");
        goto out;
    }
    memcpy(e->name, name, len);
    e->fn = fn;
    e->ctor = ctor;
    e->dtor = dtor;
    entries[nentries++] = e;
out:
    pthread_mutex_unlock(&reg_lock);
    return st;
}

static void register_builtins(void)
{
    in_builtins = true;
    builtins_status = tern__rpc_register_builtins();
    in_builtins = false;
}

tern_status_t tern__rpc_builtins(void)
{
    pthread_once(&builtins_once, register_builtins);
    return builtins_status;
}

/* The built-ins come first, so a program's function cannot take their names
 * quietly before tern_rpc_init and then fail it on this rank alone. */
tern_status_t tern_rpc_register(const char *name, tern_rpc_fn fn)
{
    tern_status_t st = in_builtins ? TERN_OK : tern__rpc_builtins();
    return st != TERN_OK ? st : add(name, fn, NULL, NULL);
}

tern_status_t tern_rpc_register_class(const char *name, tern_rpc_ctor ctor, tern_rpc_dtor dtor)
{
    if (ctor == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_rpc_register_class: '%s' needs a "
                                                   "constructor",
                           name ? name : "(null)");
    tern_status_t st = tern__rpc_builtins();
    return st != TERN_OK ? st : add(name, NULL, ctor, dtor);
}

const tern__rpc_entry_t *tern__rpc_lookup(const char *name, size_t len)
{
    tern__rpc_builtins();
    pthread_mutex_lock(&reg_lock);
    const tern__rpc_entry_t *e = find_locked(name, len);
    pthread_mutex_unlock(&reg_lock);
    return e;
}
