/* Export macro and small shared definitions for tern's public headers. */
#ifndef TERN_DEFS_H
#define TERN_DEFS_H

#if defined(TERN_BUILDING) && defined(__GNUC__)
#define TERN_API __attribute__((visibility("default")))
#else
#define TERN_API
#endif

#if defined(__GNUC__)
#define TERN_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define TERN_PRINTF(fmt_idx, arg_idx)
#endif

#ifdef __cplusplus
#define TERN_BEGIN_DECLS extern "C" {
#define TERN_END_DECLS }
#else
#define TERN_BEGIN_DECLS
#define TERN_END_DECLS
#endif

#endif
