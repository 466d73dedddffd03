/* c-counter: a hermes-hooks dynamic-library hook in plain C (ABI v1).
 *
 * For every event it returns {"handled_by": "c", "event": "<name>", "calls": N,
 * "context_bytes": M}: N counts the calls this loaded copy has handled (state kept between calls),
 * M is the size of the JSON context it was given. Build: ./build.sh DEST_DIR (see README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *ptr;
    size_t len;
} HermesHookBuf;

static unsigned long long calls;

uint32_t hermes_hook_abi_version(void) { return 1; }

/* Optional: runs once when the library is loaded; non-zero refuses the load. */
int32_t hermes_hook_init(const uint8_t *hook_dir, size_t len) {
    (void)hook_dir;
    (void)len;
    calls = 0;
    return 0;
}

/* Writes `s` into `out` as a malloc'd buffer; returns `rc`. */
static int32_t reply(HermesHookBuf *out, char *s, size_t len, int32_t rc) {
    out->ptr = (uint8_t *)s;
    out->len = len;
    return rc;
}

int32_t hermes_hook_handle(const uint8_t *event, size_t event_len, const uint8_t *context,
                           size_t context_len, HermesHookBuf *out) {
    (void)context;
    calls++;
    /* Event names never hold control characters; escape the two JSON specials. */
    size_t cap = 128 + 2 * event_len;
    char *buf = malloc(cap);
    if (buf == NULL) {
        static const char oom[] = "out of memory";
        char *m = malloc(sizeof oom);
        if (m == NULL) return reply(out, NULL, 0, 1);
        memcpy(m, oom, sizeof oom - 1);
        return reply(out, m, sizeof oom - 1, 1);
    }
    size_t n = (size_t)snprintf(buf, cap, "{\"handled_by\": \"c\", \"event\": \"");
    for (size_t i = 0; i < event_len; i++) {
        if (event[i] == '"' || event[i] == '\\') buf[n++] = '\\';
        buf[n++] = (char)event[i];
    }
    n += (size_t)snprintf(buf + n, cap - n, "\", \"calls\": %llu, \"context_bytes\": %zu}", calls,
                          context_len);
    return reply(out, buf, n, 0);
}

/* Frees what hermes_hook_handle put in `out`. */
void hermes_hook_free(HermesHookBuf buf) { free(buf.ptr); }

/* Optional: runs once after the last call (hook removed, reloaded, or the service stops). */
void hermes_hook_shutdown(void) { fprintf(stderr, "c-counter: shutting down after %llu call(s)\n", calls); }
