/* _memcore: a hand-written C core for memory://'s hot paths (issue #27).
 *
 * A PROTOTYPE, not shipped: it answers "what is the ceiling of a C extension
 * core that still returns the real public objects". Core implements, for
 * exclusive claims of dibs.Units (one, or a group), what MemoryStore's inline
 * paths (and the general steps they fall into for units) do: claim (a hold with
 * a TTL, or confirmed at once; an optional request ID that replays; a unit held
 * live or confirmed by another holder is not granted, with taken= the taken
 * units in the claim's order; the same holder re-claiming exactly what it holds
 * is replayed; a dead hold is taken over), confirm(claim_id, holder, fence) and
 * release(claim_id, holder, fence), get and holder_of. Groups: claim() of a list
 * or tuple of Units (normalized as MemoryStore.claim does: sorted by
 * (resource, slot), de-duplicated) and _claim_checked(units, holder), the
 * group claim dibs.Lot makes through Store._claim_checked (MemoryStore's
 * _claim_units with no request ID, confirmed at once).
 *
 * Objects returned are the real ones: a dibs.Claim made as
 * claim_from_micros() makes it (object.__new__ and a __dict__ holding the
 * record's ten keys, times as the _*_us integers) and a dibs.ClaimResult made
 * as _granted() / make_result() make it.
 *
 * Records: a C struct (Rec, a non-GC object) with the hot fields native (state,
 * fence, expiry) and the pure store's record's ten values in an array; a
 * snapshot is a copy of a template dict of the ten keys with those values
 * written in (see record_dict). Indexes: the units and request IDs in PyDicts
 * keyed by str (Unit._key, request ID); the claims in a vector indexed by
 * fence (a claim ID is the prefix and its fence); each holder's claims in a
 * list linked through the records, from a PyDict keyed by holder.
 *
 * Atomicity: one PyThread lock per Core, taken without waiting when free (the
 * GIL is released only to wait for it). The GIL alone would NOT do in 3.11: an
 * allocation of a GC object in the check-then-set (the record dict, the Claim)
 * can start a collection there, which runs __del__ methods and weakref
 * callbacks, i.e. Python code that may hand the GIL to another thread.
 * Build with -DMEMCORE_NO_LOCK to measure what the lock costs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <math.h>
#include <string.h>
#include <time.h>
#ifndef MEMCORE_PUBLIC_ONLY
#define Py_BUILD_CORE 1
#include "internal/pycore_dict.h"
#undef Py_BUILD_CORE
#endif

enum { HELD = 0, CONFIRMED = 1, RELEASED = 2, EXPIRED = 3 };

/* Imported from dibs once, at module init. */
static PyTypeObject *ClaimType, *ClaimResultType, *UnitType;
static PyObject *STATES[4];
static PyObject *fn_sorted, *fn_unit_key;
static PyObject *fn_claim_not_found, *fn_not_holder, *fn_hold_lost, *fn_ring, *RequestConflict;
static PyObject *REASON_FENCE, *REASON_RELEASED, *REASON_EXPIRED, *REASON_TAKEN_OVER;
static PyObject *EXCLUSIVE;
static Py_ssize_t unit_key_offset;
static Py_ssize_t name_max;
static double ttl_min, ttl_max;

/* Interned keys. */
static PyObject *k_id, *k_holder, *k_targets, *k_state, *k_fence, *k_request_id, *k_ttl_priv,
    *k_expires, *k_created, *k_updated, *k_taken_over, *k_granted, *k_claim, *k_taken,
    *k_replayed, *kw_ttl;

/* ---------------------------------------------------------------- records */

typedef struct Rec {
    PyObject_HEAD
    /* The pure store's record's ten values, in its keys' order (KEYS below): a
     * snapshot is a copy of a template dict of those keys with these values. */
    PyObject *vals[10];
    PyObject *id;         /* str */
    PyObject *holder;     /* str */
    PyObject *targets;    /* (unit,) */
    PyObject *key;        /* unit._key */
    PyObject *ttl;        /* as asked: None, int or float */
    int state;
    int taken_over;
    long long fence;
    long long expires_us; /* meaningful while HELD */
    long long created_us;
    /* The holder's index: an intrusive list, the holder's entry in by_holder. */
    struct Holder *list;  /* NULL once unlinked */
    struct Rec *prev, *next;
} Rec;

/* A holder's live claims (MemoryStore._by_holder[holder]): a list through the records. */
typedef struct Holder {
    PyObject_HEAD
    Rec *head, *tail;
    Py_ssize_t size;
} Holder;

static void
Holder_dealloc(Holder *h)
{
    for (Rec *r = h->head; r != NULL; r = r->next)
        r->list = NULL;
    PyObject_Free(h);
}

static PyTypeObject HolderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_memcore.Holder",
    .tp_basicsize = sizeof(Holder),
    .tp_dealloc = (destructor)Holder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static void
Rec_dealloc(Rec *r)
{
    /* A record dies only with its Core, after the holder lists are gone. */
    for (int i = 0; i < 10; i++)
        Py_XDECREF(r->vals[i]);
    Py_XDECREF(r->id);
    Py_XDECREF(r->holder);
    Py_XDECREF(r->targets);
    Py_XDECREF(r->key);
    Py_XDECREF(r->ttl);
    PyObject_Free(r);
}

static PyTypeObject RecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_memcore.Rec",
    .tp_basicsize = sizeof(Rec),
    .tp_dealloc = (destructor)Rec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* ---------------------------------------------------------------- Core */

typedef struct {
    PyObject_HEAD
    PyObject *units;      /* Unit._key -> Rec */
    Rec **by_fence;       /* the claims: claim ID prefix + fence -> by_fence[fence - 1] */
    Py_ssize_t nclaims, cap;
    PyObject *by_holder;  /* holder -> Holder (its claims, linked) */
    PyObject *requests;   /* request ID -> Rec (granted inline) or a 7-tuple (general) */
    PyObject *prefix;     /* ASCII str, e.g. "1a2b3c4d-" */
    PyObject *clock;      /* None: the system clock; else a callable giving float seconds */
    PyThread_type_lock lock;
    long long next_fence;
    long long newest_fence;
    long long retention_us;
} Core;

static inline int
core_lock(Core *self)
{
#ifndef MEMCORE_NO_LOCK
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
#endif
    return 0;
}

static inline void
core_unlock(Core *self)
{
#ifndef MEMCORE_NO_LOCK
    PyThread_release_lock(self->lock);
#endif
}

/* Microseconds now, as MemoryStore._now_us: (time_ns() + 500) // 1000 on the
 * system clock (time.time_ns reads CLOCK_REALTIME), round(now() * 1e6) else. */
static int
now_us(Core *self, long long *out)
{
    if (self->clock == Py_None) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        *out = (ns + 500) / 1000;
        return 0;
    }
    PyObject *t = PyObject_CallNoArgs(self->clock);
    if (t == NULL)
        return -1;
    double x = PyFloat_AsDouble(t);
    Py_DECREF(t);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *out = (long long)rint(x * 1000000.0); /* half to even, as round() */
    return 0;
}

/* round(ttl * 1_000_000) for an int or float TTL. */
static long long
ttl_us(PyObject *ttl)
{
    if (PyLong_CheckExact(ttl))
        return PyLong_AsLongLong(ttl) * 1000000LL;
    return (long long)rint(PyFloat_AS_DOUBLE(ttl) * 1000000.0);
}

/* A plain name as the inline paths accept it: str, non-empty, ASCII, no NUL, short. */
static inline int
plain_name(PyObject *s)
{
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    return n > 0 && n <= name_max && memchr(PyUnicode_DATA(s), 0, n) == NULL;
}

static inline int
live(Rec *r, long long now)
{
    return r->state == CONFIRMED || (r->state == HELD && r->expires_us > now);
}

static PyObject *
new_long_or_none(int is_none, long long v)
{
    if (is_none)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

enum { V_ID, V_HOLDER, V_TARGETS, V_STATE, V_FENCE, V_REQUEST_ID, V_TTL, V_EXPIRES, V_CREATED,
       V_UPDATED };
static PyObject *KEYS[10];
static PyObject *TEMPLATE; /* {key: None for key in KEYS}, untracked */

/* The record's values as a new dict, keys in the pure record's order.
 *
 * MEMCORE_PUBLIC_ONLY: PyDict_Copy(TEMPLATE), then PyDict_SetItem for each key
 * (each replaces a value in place: no resize). Otherwise the values are written
 * straight into the copy's entries (CPython 3.11's internal dict layout, from
 * internal/pycore_dict.h): the copy is fresh, no one has seen it, so no version
 * tag needs to move. Either way the dict stays untracked (see untrack()). */
static PyObject *
record_dict(Rec *r, int expired)
{
    PyObject *d = PyDict_Copy(TEMPLATE);
    if (d == NULL)
        return NULL;
#ifdef MEMCORE_PUBLIC_ONLY
    for (int i = 0; i < 10; i++)
        if (PyDict_SetItem(d, KEYS[i], r->vals[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    PyObject_GC_UnTrack(d);
#else
    PyDictUnicodeEntry *e = DK_UNICODE_ENTRIES(((PyDictObject *)d)->ma_keys);
    for (int i = 0; i < 10; i++) {
        PyObject *old = e[i].me_value;
        Py_INCREF(r->vals[i]);
        e[i].me_value = r->vals[i];
        Py_DECREF(old);
    }
#endif
    if ((expired && PyDict_SetItem(d, k_state, STATES[EXPIRED]) < 0) ||
        (r->taken_over && PyDict_SetItem(d, k_taken_over, Py_True) < 0)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* A new instance of ``type`` whose __dict__ is ``values`` (stolen, also on
 * failure). tp_alloc leaves the managed dict and its inline values NULL: the
 * __dict__ slot takes our dict as is (what object.__new__ + update make). */
static PyObject *
with_dict(PyTypeObject *type, PyObject *values)
{
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    *_PyObject_GetDictPtr(obj) = values;
    return obj;
}

/* A Claim whose __dict__ holds the record (claim_from_micros); a hold dead
 * before a sweep marked it reads expired (_snapshot). */
static PyObject *
snapshot(Rec *r, long long now)
{
    PyObject *values = record_dict(r, r->state == HELD && r->expires_us <= now);
    if (values == NULL)
        return NULL;
    return with_dict(ClaimType, values);
}

/* A ClaimResult with just these keys in its __dict__ (the rest read the class defaults). */
static PyObject *
result2(PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2)
{
    PyObject *values = PyDict_New();
    if (values == NULL)
        return NULL;
    if (PyDict_SetItem(values, k1, v1) < 0 || PyDict_SetItem(values, k2, v2) < 0) {
        Py_DECREF(values);
        return NULL;
    }
    return with_dict(ClaimResultType, values);
}

/* make_result(granted, claim, taken, replayed): all four keys. */
static PyObject *
make_result(int granted, PyObject *claim, PyObject *taken, int replayed)
{
    PyObject *values = _PyDict_NewPresized(4);
    if (values == NULL)
        return NULL;
    if (PyDict_SetItem(values, k_granted, granted ? Py_True : Py_False) < 0 ||
        PyDict_SetItem(values, k_claim, claim ? claim : Py_None) < 0 ||
        PyDict_SetItem(values, k_taken, taken) < 0 ||
        PyDict_SetItem(values, k_replayed, replayed ? Py_True : Py_False) < 0) {
        Py_DECREF(values);
        return NULL;
    }
    return with_dict(ClaimResultType, values);
}

static PyObject *
lost_result(PyObject *unit)
{
    PyObject *taken = PyTuple_Pack(1, unit);
    if (taken == NULL)
        return NULL;
    PyObject *res = result2(k_granted, Py_False, k_taken, taken);
    Py_DECREF(taken);
    return res;
}

/* The claim ID: the store's prefix and the fence in decimal. */
static PyObject *
claim_id_of(Core *self, long long fence)
{
    char buf[24], *digits = buf + sizeof buf;
    unsigned long long v = (unsigned long long)fence;
    do {
        *--digits = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    int n = (int)(buf + sizeof buf - digits);
    Py_ssize_t plen = PyUnicode_GET_LENGTH(self->prefix);
    PyObject *s = PyUnicode_New(plen + n, 127);
    if (s == NULL)
        return NULL;
    char *data = (char *)PyUnicode_1BYTE_DATA(s);
    memcpy(data, PyUnicode_1BYTE_DATA(self->prefix), plen);
    memcpy(data + plen, digits, n);
    return s;
}

/* Index a claim under its holder: append it to the holder's list. */
static int
index_holder(Core *self, PyObject *holder, Rec *r)
{
    Holder *h = (Holder *)PyDict_GetItemWithError(self->by_holder, holder);
    if (h == NULL) {
        if (PyErr_Occurred())
            return -1;
        h = PyObject_New(Holder, &HolderType);
        if (h == NULL)
            return -1;
        h->head = h->tail = NULL;
        h->size = 0;
        int rc = PyDict_SetItem(self->by_holder, holder, (PyObject *)h);
        Py_DECREF(h); /* the index keeps it */
        if (rc < 0)
            return -1;
    }
    r->list = h;
    r->next = NULL;
    r->prev = h->tail;
    if (h->tail)
        h->tail->next = r;
    else
        h->head = r;
    h->tail = r;
    h->size++;
    return 0;
}

/* mine.pop(claim_id, None): unlink the record; returns its list, now maybe empty. */
static Holder *
forget_holder(Core *self, Rec *r)
{
    Holder *h = r->list;
    if (h == NULL)
        return NULL;
    if (r->prev)
        r->prev->next = r->next;
    else
        h->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        h->tail = r->prev;
    r->prev = r->next = NULL;
    r->list = NULL;
    h->size--;
    return h;
}

/* The record of a claim ID, borrowed, or NULL: the ID must be this Core's prefix
 * and a fence in decimal as claim_id_of writes it, and the record's own ID. */
static Rec *
find_claim(Core *self, PyObject *claim_id)
{
    if (!PyUnicode_CheckExact(claim_id) || !PyUnicode_IS_ASCII(claim_id))
        return NULL;
    Py_ssize_t plen = PyUnicode_GET_LENGTH(self->prefix), n = PyUnicode_GET_LENGTH(claim_id);
    if (n <= plen || n - plen > 18)
        return NULL;
    const char *data = (const char *)PyUnicode_1BYTE_DATA(claim_id);
    if (memcmp(data, PyUnicode_1BYTE_DATA(self->prefix), plen) != 0)
        return NULL;
    long long fence = 0;
    for (Py_ssize_t i = plen; i < n; i++) {
        if (data[i] < '0' || data[i] > '9')
            return NULL;
        fence = fence * 10 + (data[i] - '0');
    }
    if (fence < 1 || fence > self->nclaims)
        return NULL;
    Rec *r = self->by_fence[fence - 1];
    if (r == NULL || (r->id != claim_id && PyUnicode_Compare(r->id, claim_id) != 0))
        return NULL; /* purged, or a spelling such as a leading zero */
    return r;
}

static int
add_claim(Core *self, Rec *r)
{
    if (r->fence != self->nclaims + 1) {
        PyErr_SetString(PyExc_RuntimeError, "fences out of order");
        return -1;
    }
    if (self->nclaims == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 1024;
        Rec **grown = PyMem_Realloc(self->by_fence, cap * sizeof(Rec *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->by_fence = grown;
        self->cap = cap;
    }
    Py_INCREF(r);
    self->by_fence[self->nclaims++] = r;
    return 0;
}

/* The record's dict and targets are private to the Core (the targets tuple is shared
 * with snapshots, but a tuple cannot change) and hold nothing that could refer back
 * to them, so they can never be part of a cycle: take them out of the collector's
 * view, or every record stays a tracked object the collector walks for as long as
 * the Core keeps it (an insert of a tracked value, e.g. a ClaimState member,
 * tracks a dict again: untrack after every write). Snapshots copied from an
 * untracked dict start untracked (PyDict_Copy keeps the tracking). */
static inline void
untrack(Rec *r)
{
#ifndef MEMCORE_TRACKED
    PyObject_GC_UnTrack(r->targets);
#endif
}

static inline PyObject *
key_of(PyObject *unit)
{
    return *(PyObject **)((char *)unit + unit_key_offset);
}

/* A new record, indexed under its units, its ID and its holder (the caller holds
 * the lock). targets: the claimed units, a tuple (one unit, or a group sorted and
 * de-duplicated as _claim_units receives it); key: the first unit's key. */
static Rec *
new_record(Core *self, PyObject *targets, PyObject *key, PyObject *holder, PyObject *request_id,
           PyObject *ttl, long long now)
{
    long long fence = self->newest_fence = self->next_fence++;
    Rec *r = PyObject_New(Rec, &RecType);
    if (r == NULL)
        return NULL;
    memset(r->vals, 0, sizeof r->vals);
    r->id = r->holder = r->targets = r->key = r->ttl = NULL;
    r->list = NULL;
    r->prev = r->next = NULL;
    r->state = ttl == Py_None ? CONFIRMED : HELD;
    r->taken_over = 0;
    r->fence = fence;
    r->created_us = now;
    r->expires_us = ttl == Py_None ? 0 : now + ttl_us(ttl);
    PyObject *pnow = PyLong_FromLongLong(now);
    r->vals[V_ID] = r->id = claim_id_of(self, fence);
    r->vals[V_HOLDER] = r->holder = Py_NewRef(holder);
    r->vals[V_TARGETS] = r->targets = Py_NewRef(targets);
    r->vals[V_STATE] = Py_NewRef(STATES[r->state]);
    r->vals[V_FENCE] = PyLong_FromLongLong(fence);
    r->vals[V_REQUEST_ID] = Py_NewRef(request_id);
    r->vals[V_TTL] = r->ttl = Py_NewRef(ttl);
    r->vals[V_EXPIRES] = new_long_or_none(ttl == Py_None, r->expires_us);
    r->vals[V_CREATED] = Py_XNewRef(pnow);
    r->vals[V_UPDATED] = pnow;
    r->key = Py_NewRef(key);
    /* The record holds its own references to id, holder, targets and ttl too. */
    Py_XINCREF(r->id);
    Py_INCREF(holder);
    Py_XINCREF(r->targets);
    Py_INCREF(ttl);
    for (int i = 0; i < 10; i++)
        if (r->vals[i] == NULL) {
            Py_DECREF(r);
            return NULL;
        }
    untrack(r);
    Py_ssize_t n = PyTuple_GET_SIZE(targets);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_SetItem(self->units, i ? key_of(PyTuple_GET_ITEM(targets, i)) : key,
                           (PyObject *)r) < 0) {
            Py_DECREF(r);
            return NULL;
        }
    if (add_claim(self, r) < 0 || index_holder(self, holder, r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static inline void
set_val(Rec *r, int i, PyObject *v) /* steals v */
{
    PyObject *old = r->vals[i];
    r->vals[i] = v;
    Py_XDECREF(old);
}

/* Write a transition into the record. */
static int
set_state(Rec *r, int state, int has_expiry, long long expires, long long now)
{
    PyObject *pexp = new_long_or_none(!has_expiry, expires);
    PyObject *pnow = PyLong_FromLongLong(now);
    if (pexp == NULL || pnow == NULL) {
        Py_XDECREF(pexp);
        Py_XDECREF(pnow);
        return -1;
    }
    r->state = state;
    r->expires_us = expires;
    set_val(r, V_STATE, Py_NewRef(STATES[state]));
    set_val(r, V_EXPIRES, pexp);
    set_val(r, V_UPDATED, pnow);
    return 0;
}

/* A dead hold's takeover (_kill with taken_over=True, then _forget_holder). */
static int
kill_taken_over(Core *self, Rec *old, long long now)
{
    PyObject *pnow = PyLong_FromLongLong(now);
    if (pnow == NULL)
        return -1;
    old->state = EXPIRED;
    old->taken_over = 1;
    set_val(old, V_STATE, Py_NewRef(STATES[EXPIRED]));
    set_val(old, V_UPDATED, pnow);
    forget_holder(self, old);
    return 0;
}

/* _request(entry): the 7 fields of a request record, borrowed. */
typedef struct {
    PyObject *holder, *targets, *ttl, *claim_id, *taken;
    long long created_us;
} Req;

static int
read_request(PyObject *entry, Req *q)
{
    if (Py_IS_TYPE(entry, &RecType)) {
        Rec *r = (Rec *)entry;
        q->holder = r->holder;
        q->targets = r->targets;
        q->ttl = r->ttl;
        q->claim_id = r->id;
        q->taken = NULL;
        q->created_us = r->created_us;
        return 0;
    }
    q->holder = PyTuple_GET_ITEM(entry, 0);
    q->targets = PyTuple_GET_ITEM(entry, 1);
    q->ttl = PyTuple_GET_ITEM(entry, 2);
    q->claim_id = PyTuple_GET_ITEM(entry, 3);
    q->taken = PyTuple_GET_ITEM(entry, 4);
    q->created_us = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 5));
    return 0;
}

/* Targets equal (the tuples' ==): unit by unit the same object, or units with the same key. */
static int
same_targets(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (PyTuple_GET_SIZE(b) != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *u = PyTuple_GET_ITEM(a, i), *v = PyTuple_GET_ITEM(b, i);
        if (u == v)
            continue;
        if (Py_TYPE(u) != UnitType || Py_TYPE(v) != UnitType)
            return 0;
        PyObject *ka = key_of(u), *kb = key_of(v);
        if (ka != kb && PyUnicode_Compare(ka, kb) != 0)
            return 0;
    }
    return 1;
}

/* same_targets against one unit, without a tuple. */
static int
same_unit_targets(PyObject *a, PyObject *unit)
{
    if (PyTuple_GET_SIZE(a) != 1)
        return 0;
    PyObject *u = PyTuple_GET_ITEM(a, 0);
    if (u == unit)
        return 1;
    if (Py_TYPE(u) != UnitType)
        return 0;
    PyObject *ka = key_of(u), *kb = key_of(unit);
    return ka == kb || PyUnicode_Compare(ka, kb) == 0;
}

/* _decide for exclusive units (no readers, no spans): targets, a tuple of one unit
 * or a sorted, de-duplicated group. Every target's writer is looked at: a live one
 * makes the target taken (one live claim of exactly these targets by this holder
 * is a replay), a dead hold not yet taken over is taken over once the claim is
 * granted. Returns a new result. */
static PyObject *
decide(Core *self, PyObject *targets, PyObject *holder, PyObject *request_id, PyObject *ttl,
       long long now, PyObject **granted_id)
{
    Py_ssize_t n = PyTuple_GET_SIZE(targets), ndead = 0;
    PyObject *taken = NULL, *res = NULL;
    Rec *only = NULL, *dead_here[8], **dead = dead_here;
    int many = 0;
    *granted_id = NULL;
    if (n > 8 && (dead = PyMem_Malloc(n * sizeof(Rec *))) == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *unit = PyTuple_GET_ITEM(targets, i);
        Rec *w = (Rec *)PyDict_GetItemWithError(self->units, key_of(unit));
        if (w == NULL) {
            if (PyErr_Occurred())
                goto done;
            continue;
        }
        if (live(w, now)) {
            if (taken == NULL && (taken = PyList_New(0)) == NULL)
                goto done;
            if (PyList_Append(taken, unit) < 0)
                goto done;
            if (only == NULL)
                only = w;
            else if (only != w)
                many = 1;
        } else if (w->state == HELD || (w->state == EXPIRED && !w->taken_over)) {
            dead[ndead++] = w; /* borrowed: the claims vector keeps it */
        }
    }
    if (taken != NULL) {
        if (!many && PyUnicode_Compare(only->holder, holder) == 0 &&
            same_targets(only->targets, targets)) {
            /* Natural key: the holder re-claiming exactly what it holds. */
            PyObject *claim = snapshot(only, now);
            if (claim == NULL)
                goto done;
            PyObject *empty = PyTuple_New(0);
            res = make_result(1, claim, empty, 1);
            Py_XDECREF(empty);
            Py_DECREF(claim);
            *granted_id = only->id;
            goto done;
        }
        PyObject *tuple = PyList_AsTuple(taken);
        if (tuple == NULL)
            goto done;
        res = make_result(0, NULL, tuple, 0);
        Py_DECREF(tuple);
        goto done;
    }
    /* _kill(taken_over=True) and _forget_holder, idempotent: a dead group hold on
     * several of these units is in dead once per unit. */
    for (Py_ssize_t i = 0; i < ndead; i++)
        if (kill_taken_over(self, dead[i], now) < 0)
            goto done;
    Rec *r = new_record(self, targets, key_of(PyTuple_GET_ITEM(targets, 0)), holder, request_id,
                        ttl, now);
    if (r == NULL)
        goto done;
    *granted_id = r->id;
    PyObject *claim = snapshot(r, now);
    Py_DECREF(r);
    if (claim == NULL)
        goto done;
    res = result2(k_granted, Py_True, k_claim, claim);
    Py_DECREF(claim);
done:
    Py_XDECREF(taken);
    if (dead != dead_here)
        PyMem_Free(dead);
    return res;
}

/* _claim_locked: a request ID's replay or conflict, else decide and record the request. */
static PyObject *
claim_locked(Core *self, PyObject *targets, PyObject *holder, PyObject *request_id,
             PyObject *ttl, long long now)
{
    if (request_id != Py_None) {
        PyObject *entry = PyDict_GetItemWithError(self->requests, request_id);
        if (entry == NULL && PyErr_Occurred())
            return NULL;
        if (entry != NULL) {
            Req q;
            read_request(entry, &q);
            if (q.created_us + self->retention_us > now) {
                int same_ttl = PyObject_RichCompareBool(q.ttl, ttl, Py_EQ);
                if (same_ttl < 0)
                    return NULL;
                if (PyUnicode_Compare(q.holder, holder) != 0 ||
                    !same_targets(q.targets, targets) || !same_ttl) {
                    PyObject *msg = PyUnicode_FromFormat(
                        "request ID %R was already used with different input", request_id);
                    PyObject *cargs = msg ? PyTuple_Pack(1, msg) : NULL;
                    PyObject *kw = Py_BuildValue("{sO}", "request_id", request_id);
                    PyObject *exc = cargs && kw ? PyObject_Call(RequestConflict, cargs, kw) : NULL;
                    Py_XDECREF(msg);
                    Py_XDECREF(cargs);
                    Py_XDECREF(kw);
                    if (exc != NULL) {
                        PyErr_SetObject(RequestConflict, exc);
                        Py_DECREF(exc);
                    }
                    return NULL;
                }
                /* _replay */
                if (q.claim_id == Py_None)
                    return make_result(0, NULL, q.taken, 1);
                Rec *r = find_claim(self, q.claim_id);
                PyObject *claim = NULL;
                if (r != NULL) {
                    claim = snapshot(r, now);
                    if (claim == NULL)
                        return NULL;
                }
                PyObject *empty = PyTuple_New(0);
                PyObject *res = make_result(1, claim, empty, 1);
                Py_DECREF(empty);
                Py_XDECREF(claim);
                return res;
            }
        }
    }
    PyObject *granted_id;
    PyObject *res = decide(self, targets, holder, request_id, ttl, now, &granted_id);
    if (res == NULL || request_id == Py_None)
        return res;
    /* The request record: (holder, targets, ttl, claim ID or None, taken, created, mode). */
    PyObject *taken = PyDict_GetItem(*_PyObject_GetDictPtr(res), k_taken);
    PyObject *empty = NULL;
    if (taken == NULL)
        taken = empty = PyTuple_New(0);
    PyObject *entry = Py_BuildValue("(OOOOOLO)", holder, targets, ttl,
                                    granted_id ? granted_id : Py_None, taken, now, EXCLUSIVE);
    Py_XDECREF(empty);
    if (entry == NULL || PyDict_SetItem(self->requests, request_id, entry) < 0) {
        Py_XDECREF(entry);
        Py_DECREF(res);
        return NULL;
    }
    Py_DECREF(entry);
    return res;
}

/* _claim_units: a group claim, its targets a tuple of units sorted and
 * de-duplicated, its names checked. All free and no request ID seen: granted
 * inline; anything else (a unit indexed, live or dead; a request ID known) takes
 * the general step, as the pure store's does. */
static PyObject *
group_claim(Core *self, PyObject *targets, PyObject *holder, PyObject *request_id, PyObject *ttl)
{
    PyObject *res = NULL;
    long long now;
    Py_ssize_t n = PyTuple_GET_SIZE(targets);
    core_lock(self);
    if (now_us(self, &now) < 0)
        goto done;
    if (request_id != Py_None) {
        int has = PyDict_Contains(self->requests, request_id);
        if (has < 0)
            goto done;
        if (has) {
            res = claim_locked(self, targets, holder, request_id, ttl, now);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int has = PyDict_Contains(self->units, key_of(PyTuple_GET_ITEM(targets, i)));
        if (has < 0)
            goto done;
        if (has) {
            res = claim_locked(self, targets, holder, request_id, ttl, now);
            goto done;
        }
    }
    Rec *r = new_record(self, targets, key_of(PyTuple_GET_ITEM(targets, 0)), holder, request_id,
                        ttl, now);
    if (r == NULL)
        goto done;
    if (request_id != Py_None && PyDict_SetItem(self->requests, request_id, (PyObject *)r) < 0) {
        Py_DECREF(r);
        goto done;
    }
    PyObject *claim = snapshot(r, now);
    Py_DECREF(r);
    if (claim != NULL) {
        res = result2(k_granted, Py_True, k_claim, claim);
        Py_DECREF(claim);
    }
done:
    core_unlock(self);
    return res;
}

/* _claim_checked(units, holder): a group of units sorted and de-duplicated, a
 * plain holder (the Lot checked both), confirmed at once. */
static PyObject *
Core__claim_checked(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    int ok = nargs == 2 && PyTuple_CheckExact(args[0]) && PyTuple_GET_SIZE(args[0]) > 0 &&
             PyUnicode_CheckExact(args[1]);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(args[0]); i++)
        ok = Py_TYPE(PyTuple_GET_ITEM(args[0], i)) == UnitType;
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "_claim_checked(units: tuple[Unit, ...], holder: str)");
        return NULL;
    }
    return group_claim(self, args[0], args[1], Py_None, Py_None);
}

/* holder_of(unit): the holder of the unit's live claim, or None. */
static PyObject *
Core_holder_of(Core *self, PyObject *unit)
{
    if (Py_TYPE(unit) != UnitType) {
        PyErr_SetString(PyExc_NotImplementedError, "prototype: holder_of a Unit only");
        return NULL;
    }
    long long now;
    PyObject *out = NULL;
    core_lock(self);
    Rec *r = (Rec *)PyDict_GetItemWithError(self->units, key_of(unit));
    if (r == NULL) {
        if (!PyErr_Occurred())
            out = Py_NewRef(Py_None);
    } else if (now_us(self, &now) == 0)
        out = Py_NewRef(live(r, now) ? r->holder : Py_None);
    core_unlock(self);
    return out;
}

/* claim(targets)'s group normalization: tuple(sorted(set(targets), key=_unit_key)). */
static PyObject *
normalize_units(PyObject *targets)
{
    PyObject *set = PySet_New(targets);
    if (set == NULL)
        return NULL;
    PyObject *args = PyTuple_Pack(1, set);
    Py_DECREF(set);
    if (args == NULL)
        return NULL;
    PyObject *kw = Py_BuildValue("{sO}", "key", fn_unit_key);
    PyObject *sorted = kw ? PyObject_Call(fn_sorted, args, kw) : NULL;
    Py_DECREF(args);
    Py_XDECREF(kw);
    if (sorted == NULL)
        return NULL;
    PyObject *units = PyList_AsTuple(sorted);
    Py_DECREF(sorted);
    return units;
}

static PyObject *
Core_claim(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *holder = NULL, *request_id = Py_None, *ttl = Py_None;
    if (nargs != 1)
        return PyErr_Format(PyExc_TypeError, "claim() takes one target");
    PyObject *unit = args[0];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[1 + i];
        if (name == k_holder || PyUnicode_Compare(name, k_holder) == 0)
            holder = value;
        else if (name == kw_ttl || PyUnicode_Compare(name, kw_ttl) == 0)
            ttl = value;
        else if (name == k_request_id || PyUnicode_Compare(name, k_request_id) == 0)
            request_id = value;
        else
            return PyErr_Format(PyExc_TypeError, "claim() got an unexpected keyword %R", name);
    }
    /* The inline paths' conditions; a real store sends anything else to Store.claim. */
    if (holder == NULL || !plain_name(holder) ||
        (request_id != Py_None && !plain_name(request_id)) ||
        (ttl != Py_None &&
         !((PyFloat_CheckExact(ttl) && PyFloat_AS_DOUBLE(ttl) >= ttl_min &&
            PyFloat_AS_DOUBLE(ttl) <= ttl_max) ||
           (PyLong_CheckExact(ttl) && PyLong_AsDouble(ttl) >= ttl_min &&
            PyLong_AsDouble(ttl) <= ttl_max)))) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "prototype: only the inline case (one Unit, plain names, TTL in range)");
        return NULL;
    }
    if (Py_TYPE(unit) != UnitType) {
        /* A group of units (a list or tuple of Units only): normalized as
         * MemoryStore.claim does, then _claim_units. */
        int group = (PyList_CheckExact(unit) || PyTuple_CheckExact(unit)) && PySequence_Fast_GET_SIZE(unit) > 0;
        for (Py_ssize_t i = 0; group && i < PySequence_Fast_GET_SIZE(unit); i++)
            group = Py_TYPE(PySequence_Fast_GET_ITEM(unit, i)) == UnitType;
        if (!group) {
            PyErr_SetString(PyExc_NotImplementedError,
                            "prototype: only a Unit or a list or tuple of Units");
            return NULL;
        }
        PyObject *units = normalize_units(unit);
        if (units == NULL)
            return NULL;
        PyObject *res = group_claim(self, units, holder, request_id, ttl);
        Py_DECREF(units);
        return res;
    }
    PyObject *key = key_of(unit);
    PyObject *res = NULL, *targets = NULL;
    long long now;
    core_lock(self);
    Rec *current = (Rec *)PyDict_GetItemWithError(self->units, key);
    if (current == NULL && PyErr_Occurred())
        goto done;
    if (current != NULL && current->state == CONFIRMED && request_id == Py_None &&
        PyUnicode_Compare(current->holder, holder) != 0) {
        res = lost_result(unit); /* confirmed by another: lost, the clock unread */
        goto done;
    }
    if (now_us(self, &now) < 0)
        goto done;
    if (request_id != Py_None) {
        int has = PyDict_Contains(self->requests, request_id);
        if (has < 0)
            goto done;
        if (has) {
            if ((targets = PyTuple_Pack(1, unit)) != NULL)
                res = claim_locked(self, targets, holder, request_id, ttl, now);
            goto done;
        }
    }
    if (current != NULL) {
        if (request_id != Py_None || !live(current, now)) {
            if ((targets = PyTuple_Pack(1, unit)) != NULL)
                res = claim_locked(self, targets, holder, request_id, ttl, now);
            goto done;
        }
        if (PyUnicode_Compare(current->holder, holder) == 0 &&
            same_unit_targets(current->targets, unit)) {
            PyObject *claim = snapshot(current, now);
            if (claim != NULL) {
                PyObject *empty = PyTuple_New(0);
                res = make_result(1, claim, empty, 1);
                Py_DECREF(empty);
                Py_DECREF(claim);
            }
            goto done;
        }
        res = lost_result(unit);
        goto done;
    }
    if ((targets = PyTuple_Pack(1, unit)) == NULL)
        goto done;
    Rec *r = new_record(self, targets, key, holder, request_id, ttl, now);
    if (r == NULL)
        goto done;
    if (request_id != Py_None && PyDict_SetItem(self->requests, request_id, (PyObject *)r) < 0) {
        Py_DECREF(r);
        goto done;
    }
    PyObject *claim = snapshot(r, now);
    Py_DECREF(r);
    if (claim != NULL) {
        res = result2(k_granted, Py_True, k_claim, claim);
        Py_DECREF(claim);
    }
done:
    core_unlock(self);
    Py_XDECREF(targets);
    return res;
}

/* Parse (claim_id, *, holder, fence) and find the record; NULL with an error set
 * for an unknown ID or another holder (ClaimNotFound, NotHolder). */
static Rec *
transition_args(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                PyObject **holder_out, long long *fence_out, PyObject **fence_obj)
{
    PyObject *holder = NULL, *fence = NULL;
    if (nargs != 1 || kwnames == NULL) {
        PyErr_SetString(PyExc_TypeError, "takes (claim_id, *, holder, fence)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == k_holder || PyUnicode_Compare(name, k_holder) == 0)
            holder = args[1 + i];
        else if (name == k_fence || PyUnicode_Compare(name, k_fence) == 0)
            fence = args[1 + i];
    }
    PyObject *claim_id = args[0];
    if (holder == NULL || fence == NULL || !PyUnicode_CheckExact(claim_id) ||
        !PyUnicode_CheckExact(holder) || !PyLong_CheckExact(fence)) {
        PyErr_SetString(PyExc_NotImplementedError, "prototype: well-typed transitions only");
        return NULL;
    }
    *holder_out = holder;
    *fence_obj = fence;
    *fence_out = PyLong_AsLongLong(fence);
    if (*fence_out == -1 && PyErr_Occurred())
        return NULL;
    Rec *r = find_claim(self, claim_id);
    if (r == NULL) {
        {
            PyObject *exc = PyObject_CallOneArg(fn_claim_not_found, claim_id);
            if (exc != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
        }
        return NULL;
    }
    if (r->holder != holder && PyUnicode_Compare(r->holder, holder) != 0) {
        PyObject *exc = PyObject_CallFunctionObjArgs(fn_not_holder, claim_id, holder, NULL);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return r;
}

/* lost_reason(): why this is not the caller's live hold (NULL: it is). */
static PyObject *
lost_reason(Rec *r, long long fence, long long now)
{
    if (r->fence != fence)
        return REASON_FENCE;
    if (r->state == RELEASED)
        return REASON_RELEASED;
    if (r->state == EXPIRED || (r->state == HELD && r->expires_us <= now))
        return r->taken_over ? REASON_TAKEN_OVER : REASON_EXPIRED;
    return NULL;
}

static void
raise_hold_lost(PyObject *claim_id, PyObject *reason, PyObject *fence)
{
    PyObject *exc = PyObject_CallFunctionObjArgs(fn_hold_lost, claim_id, reason, fence, NULL);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

static PyObject *
Core_confirm(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *holder, *fence_obj;
    long long fence, now;
    Rec *r = transition_args(self, args, nargs, kwnames, &holder, &fence, &fence_obj);
    if (r == NULL)
        return NULL;
    PyObject *claim = NULL, *reason = NULL;
    Py_INCREF(r);
    core_lock(self);
    if (now_us(self, &now) < 0)
        goto done;
    if (r->fence == fence && r->state == HELD && r->expires_us > now) {
        if (set_state(r, CONFIRMED, 0, 0, now) < 0)
            goto done;
    } else if (r->fence != fence || r->state != CONFIRMED) {
        reason = lost_reason(r, fence, now);
        goto done;
    }
    claim = snapshot(r, now);
done:
    core_unlock(self);
    if (reason != NULL)
        raise_hold_lost(r->id, reason, fence_obj);
    Py_DECREF(r);
    return claim;
}

static PyObject *
Core_release(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *holder, *fence_obj;
    long long fence, now;
    Rec *r = transition_args(self, args, nargs, kwnames, &holder, &fence, &fence_obj);
    if (r == NULL)
        return NULL;
    PyObject *out = NULL;
    int fence_lost = 0;
    Py_INCREF(r);
    core_lock(self);
    if (now_us(self, &now) < 0)
        goto done;
    if (r->fence != fence) {
        fence_lost = 1;
        goto done;
    }
    if (!live(r, now)) {
        out = Py_NewRef(Py_False);
        goto done;
    }
    if (set_state(r, RELEASED, 0, 0, now) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r->targets); i++) {
        PyObject *key = i ? key_of(PyTuple_GET_ITEM(r->targets, i)) : r->key;
        PyObject *indexed = PyDict_GetItem(self->units, key);
        if (indexed == (PyObject *)r && PyDict_DelItem(self->units, key) < 0)
            goto done;
    }
    Holder *mine = forget_holder(self, r);
    if (mine != NULL && mine->size == 0 && PyDict_DelItem(self->by_holder, holder) < 0)
        goto done;
    out = Py_NewRef(Py_True);
done:
    core_unlock(self);
    if (fence_lost)
        raise_hold_lost(r->id, REASON_FENCE, fence_obj);
    else if (out != NULL) {
        /* ring(claim_id): a waiter in this process wakes now. */
        PyObject *rung = PyObject_CallOneArg(fn_ring, r->id);
        if (rung == NULL)
            Py_CLEAR(out);
        Py_XDECREF(rung);
    }
    Py_DECREF(r);
    return out;
}

/* get(claim_id): a snapshot or None (for the check). */
static PyObject *
Core_get(Core *self, PyObject *claim_id)
{
    long long now;
    PyObject *out = NULL;
    core_lock(self);
    Rec *r = find_claim(self, claim_id);
    if (r == NULL) {
        out = Py_NewRef(Py_None);
    } else if (now_us(self, &now) == 0)
        out = snapshot(r, now);
    core_unlock(self);
    return out;
}

static int
Core_init(Core *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"prefix", "clock", "request_retention", NULL};
    PyObject *prefix = Py_None, *clock = Py_None;
    double retention = 24 * 3600.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOd", kwlist, &prefix, &clock, &retention))
        return -1;
    if (prefix == Py_None) {
        PyObject *secrets = PyImport_ImportModule("secrets");
        if (secrets == NULL)
            return -1;
        PyObject *hex = PyObject_CallMethod(secrets, "token_hex", "i", 4);
        Py_DECREF(secrets);
        if (hex == NULL)
            return -1;
        prefix = PyUnicode_FromFormat("%U-", hex);
        Py_DECREF(hex);
        if (prefix == NULL)
            return -1;
    } else {
        if (!PyUnicode_CheckExact(prefix) || !PyUnicode_IS_ASCII(prefix)) {
            PyErr_SetString(PyExc_TypeError, "prefix must be an ASCII str");
            return -1;
        }
        Py_INCREF(prefix);
    }
    Py_XSETREF(self->prefix, prefix);
    Py_INCREF(clock);
    Py_XSETREF(self->clock, clock);
    self->units = PyDict_New();
    self->by_fence = NULL;
    self->nclaims = self->cap = 0;
    self->by_holder = PyDict_New();
    self->requests = PyDict_New();
    self->lock = PyThread_allocate_lock();
    self->next_fence = 1;
    self->newest_fence = 0;
    self->retention_us = (long long)rint(retention * 1000000.0);
    if (!self->units || !self->by_holder || !self->requests || !self->lock) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
Core_dealloc(Core *self)
{
    Py_XDECREF(self->units);
    Py_XDECREF(self->by_holder); /* first: a Holder unlinks its records as it goes */
    for (Py_ssize_t i = 0; i < self->nclaims; i++)
        Py_XDECREF(self->by_fence[i]);
    PyMem_Free(self->by_fence);
    Py_XDECREF(self->requests);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->clock);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Core_counts(Core *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{snsnsnsnsL}", "units", PyDict_GET_SIZE(self->units), "claims",
                         self->nclaims, "holders",
                         PyDict_GET_SIZE(self->by_holder), "requests",
                         PyDict_GET_SIZE(self->requests), "newest_fence", self->newest_fence);
}

static PyMethodDef Core_methods[] = {
    {"claim", (PyCFunction)(void (*)(void))Core_claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(unit, *, holder, request_id=None, ttl=None) -> ClaimResult"},
    {"confirm", (PyCFunction)(void (*)(void))Core_confirm, METH_FASTCALL | METH_KEYWORDS,
     "confirm(claim_id, *, holder, fence) -> Claim"},
    {"release", (PyCFunction)(void (*)(void))Core_release, METH_FASTCALL | METH_KEYWORDS,
     "release(claim_id, *, holder, fence) -> bool"},
    {"get", (PyCFunction)Core_get, METH_O, "get(claim_id) -> Claim | None"},
    {"_claim_checked", (PyCFunction)(void (*)(void))Core__claim_checked, METH_FASTCALL,
     "_claim_checked(units, holder) -> ClaimResult (a group, confirmed at once)"},
    {"holder_of", (PyCFunction)Core_holder_of, METH_O, "holder_of(unit) -> str | None"},
    {"counts", (PyCFunction)Core_counts, METH_NOARGS, "sizes of the indexes"},
    {NULL}};

static PyMemberDef Core_members[] = {
    {"prefix", T_OBJECT, offsetof(Core, prefix), READONLY, "the claim ID prefix"},
    {NULL}};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_memcore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "memory://'s hot paths for claims of units in C (prototype)",
    .tp_methods = Core_methods,
    .tp_members = Core_members,
    .tp_init = (initproc)Core_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef memcore_module = {
    PyModuleDef_HEAD_INIT, "_memcore", "A C core prototype for memory:// (issue #27).", -1,
};

static PyObject *
attr_of(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return NULL;
    PyObject *v = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return v;
}

#define INTERN(var, text)                              \
    do {                                               \
        if (!((var) = PyUnicode_InternFromString(text))) \
            return NULL;                               \
    } while (0)

PyMODINIT_FUNC
PyInit__memcore(void)
{
    INTERN(k_id, "id");
    INTERN(k_holder, "holder");
    INTERN(k_targets, "targets");
    INTERN(k_state, "state");
    INTERN(k_fence, "fence");
    INTERN(k_request_id, "request_id");
    INTERN(k_ttl_priv, "_ttl");
    INTERN(k_expires, "_expires_at_us");
    INTERN(k_created, "_created_at_us");
    INTERN(k_updated, "_updated_at_us");
    INTERN(k_taken_over, "taken_over");
    INTERN(k_granted, "granted");
    INTERN(k_claim, "claim");
    INTERN(k_taken, "taken");
    INTERN(k_replayed, "replayed");
    INTERN(kw_ttl, "ttl");
    PyObject *keys[10] = {k_id,      k_holder,  k_targets, k_state,   k_fence,
                          k_request_id, k_ttl_priv, k_expires, k_created, k_updated};
    if (!(TEMPLATE = PyDict_New())) /* str keys from empty: a unicode-keys table */
        return NULL;
    for (int i = 0; i < 10; i++) {
        KEYS[i] = keys[i];
        if (PyDict_SetItem(TEMPLATE, keys[i], Py_None) < 0)
            return NULL;
    }
#ifndef MEMCORE_PUBLIC_ONLY
    if (((PyDictObject *)TEMPLATE)->ma_keys->dk_kind != DICT_KEYS_UNICODE ||
        ((PyDictObject *)TEMPLATE)->ma_values != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "unexpected dict layout: build with MEMCORE_PUBLIC_ONLY");
        return NULL;
    }
#endif
    if (!(ClaimType = (PyTypeObject *)attr_of("dibs._model", "Claim")) ||
        !(ClaimResultType = (PyTypeObject *)attr_of("dibs._model", "ClaimResult")) ||
        !(UnitType = (PyTypeObject *)attr_of("dibs._model", "Unit")) ||
        !(EXCLUSIVE = attr_of("dibs._model", "EXCLUSIVE")) ||
        !(fn_claim_not_found = attr_of("dibs.stores.base", "claim_not_found")) ||
        !(fn_unit_key = attr_of("dibs.stores.memory", "_unit_key")) ||
        !(fn_sorted = attr_of("builtins", "sorted")) ||
        !(fn_not_holder = attr_of("dibs.stores.base", "not_holder")) ||
        !(fn_hold_lost = attr_of("dibs.stores.base", "hold_lost")) ||
        !(fn_ring = attr_of("dibs._bell", "ring")) ||
        !(RequestConflict = attr_of("dibs.exceptions", "RequestConflict")))
        return NULL;
    PyObject *states = attr_of("dibs._model", "ClaimState");
    PyObject *reasons = attr_of("dibs.exceptions", "HoldLostReason");
    if (states == NULL || reasons == NULL)
        return NULL;
    const char *names[4] = {"HELD", "CONFIRMED", "RELEASED", "EXPIRED"};
    for (int i = 0; i < 4; i++)
        if (!(STATES[i] = PyObject_GetAttrString(states, names[i])))
            return NULL;
    if (!(REASON_FENCE = PyObject_GetAttrString(reasons, "FENCE")) ||
        !(REASON_RELEASED = PyObject_GetAttrString(reasons, "RELEASED")) ||
        !(REASON_EXPIRED = PyObject_GetAttrString(reasons, "EXPIRED")) ||
        !(REASON_TAKEN_OVER = PyObject_GetAttrString(reasons, "TAKEN_OVER")))
        return NULL;
    Py_DECREF(states);
    Py_DECREF(reasons);
    /* Unit is a slotted dataclass: read its _key slot at the member's offset. */
    PyObject *descr = PyDict_GetItemString(UnitType->tp_dict, "_key");
    if (descr == NULL || !PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_RuntimeError, "Unit._key is not a slot");
        return NULL;
    }
    unit_key_offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    PyObject *v;
    if (!(v = attr_of("dibs.limits", "NAME_MAX_BYTES")))
        return NULL;
    name_max = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (!(v = attr_of("dibs.limits", "TTL_MIN")))
        return NULL;
    ttl_min = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (!(v = attr_of("dibs.limits", "TTL_MAX")))
        return NULL;
    ttl_max = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (PyType_Ready(&RecType) < 0 || PyType_Ready(&HolderType) < 0 ||
        PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&memcore_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0)
        return NULL;
    return m;
}
