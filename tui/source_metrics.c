/* source_metrics.c - metrics adapters (in progress). */
#include "source_internal.h"

kv_source_kind source_metrics_detect(kv_source *s) { return KV_SOURCE_AUTO; }
int source_metrics_poll(kv_source *s) {
    source_set_error(s, "metrics adapters: not built yet");
    return KV_ERR_UNSUPPORTED;
}
void source_metrics_free(kv_source *s) {}
