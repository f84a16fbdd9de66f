/* Test support for the memory layer: the event hooks of the caching allocator's and the pinned pool's, which tests
 * replace by fakes they complete themselves. The other memory calls tests use are the library's own, declared in
 * deft_testing.h; including their headers here checks that those declarations match. */
#include "deft_testing.h"

#include "caching_allocator.h"
#include "device_internal.h"
#include "pinned_allocator.h"
#include "prefetch.h"

/* A pool keeps the pointer to its hooks, so each pool's live here, in one of two slots: a change writes the slot not
 * in use, and the one in use stays untouched when the pool refuses the change (blocks still wait on it). */
typedef struct deft_testing_hook_slots {
    deft_caching_event_hooks slot[2];
    int current;
} deft_testing_hook_slots;

static deft_testing_hook_slots deft_testing_device_hooks[2];   /* per deft_device_type */
static deft_testing_hook_slots deft_testing_pinned_hooks;

/* The slot to hand to the pool for `hooks` (NULL for NULL). */
static const deft_caching_event_hooks *deft_testing_hooks_stage(deft_testing_hook_slots *s,
                                                                const deft_testing_event_hooks *hooks) {
    if (!hooks) return NULL;
    deft_caching_event_hooks *next = &s->slot[1 - s->current];
    *next = (deft_caching_event_hooks){hooks->record, hooks->query, hooks->wait, hooks->destroy};
    return next;
}

static deft_status deft_testing_hooks_done(deft_testing_hook_slots *s, const deft_testing_event_hooks *hooks,
                                           deft_status st) {
    if (st == DEFT_OK && hooks) s->current = 1 - s->current;
    return st;
}

deft_status deft_testing_caching_set_event_hooks(deft_device_type type, const deft_testing_event_hooks *hooks) {
    if (type != DEFT_CPU && type != DEFT_CUDA) return deft_caching_set_event_hooks(type, NULL);
    deft_testing_hook_slots *s = &deft_testing_device_hooks[type];
    const deft_caching_event_hooks *staged = deft_testing_hooks_stage(s, hooks);
    return deft_testing_hooks_done(s, hooks, deft_caching_set_event_hooks(type, staged));
}

deft_status deft_testing_pinned_set_event_hooks(const deft_testing_event_hooks *hooks) {
    deft_testing_hook_slots *s = &deft_testing_pinned_hooks;
    const deft_caching_event_hooks *staged = deft_testing_hooks_stage(s, hooks);
    return deft_testing_hooks_done(s, hooks, deft_pinned_set_event_hooks(staged));
}
