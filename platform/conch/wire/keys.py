r"""Every Redis key, list and channel conch uses: the whole Redis schema on one page.

Each name is defined here once; the wire modules that read and write it, and repo_sync,
import it from here. The values are the wire contract: Celery, kombu, KEDA triggers and
conch processes of other versions read the same names, so none may change by a byte.
``<model>`` is a model name (``conch.core.repository_keys.is_model_name``), ``<job>`` a job id
(32 hex digits), ``<tag>`` a message's delivery tag (its task id); each constant is in
brackets under its name.

Model queues and messages in flight (``conch.wire.broker``)::

    name                           type     written by                   read by
    -----------------------------  -------  ---------------------------  ---------------------------
    conch.model.<model>            list     gateway, BLS and batch jobs  worker (the pop script);
      [QUEUE_PREFIX]                        (publish); worker (requeue); work_owed (LLEN: /metrics,
    <queue>\x06\x16<step>, 1..9    list     kombu (restore)              /queue-depth, KEDA)
      [PRIORITY_SEP] kombu's priority sub-lists of a queue, same writers and readers
    conch.model.<model>/wake       list     publish (a token a message), idle workers (BLPOP)
      [WAKE_SUFFIX]                         pop (reset to what waits)
    conch.model.<model>/in_flight  set      worker pop: the tags it put  work_owed (counts those
      [IN_FLIGHT_SUFFIX]                    in unacked; ack (SREM)       still in unacked, forgets
                                                                         the rest): queue-depth
    conch.model.<model>/in_flight_class  worker pop: tag -> the class    work_owed (in flight by
      [IN_FLIGHT_CLASS_SUFFIX]    hash      of the sub-list it left;     class); ack (HDEL)
    conch.model.<model>/bundled    hash     publish of a bundle: tag ->  work_owed (each bundle's
      [BUNDLED_SUFFIX]                      "extra step deadline"; ack   extra requests, waiting or
                                            (HDEL)                       in flight); the pop script
    conch.model.<model>/held       hash     worker pop of a bounded      publish of a bounded
      [HELD_SUFFIX]                         queue: tag -> its step;      queue (counts the tags
                                            batch run, ack (HDEL)        still in unacked, forgets
                                                                         the rest)
    conch.jobs (+ sub-lists)       list     gateway (batch job submit),  Celery workers (kombu);
      [JOBS_QUEUE]                          kombu (restore)              work_owed (LLEN, with jobs=1)
    conch.jobs/in_flight           set      batch job driver: its job id work_owed (counts those
                                            while it runs (SADD, SREM)   in unacked, forgets the rest)
    unacked                        hash     worker pop: tag -> [message, ack (HDEL); kombu restores
      [UNACKED]                             "", routing key] (kombu's)   what outlived visibility
    unacked_index                  zset     worker pop, touch:           kombu's restore sweep;
      [UNACKED_INDEX]                       tag -> epoch seconds         ack (ZREM)
    conch.attempts                 hash     worker pop: tag -> HINCRBY   worker (dead-letters past
      [ATTEMPTS]                            deliveries                   the limit); ack (HDEL)
    conch.deadletter               list     worker: JSON tag, reason,    operators (10,000 kept)
      [DEADLETTER]                          at, message
    conch.ratelimit.<pool>         zset     worker (rate limiter):       the acquire script drops
      [RATE_LIMIT_PREFIX]                   "<hold>|<copies>" -> lease   holds whose lease ended;
                                            end (wire.rate_limits)       release (ZREM)
    conch.ensemble_slots.<model>/<step>    an ensemble's runner (its    the acquire script drops
      [ENSEMBLE_SLOTS_PREFIX]     zset      max_inflight_requests):      holds whose lease ended;
                                            "<hold>|1" -> lease end      release (ZREM)
    conch.untagged                 string   the pop script (a counter    nobody; named inside the
                                            for messages with no tag)    Lua, which stays intact

Replies and job results (``conch.wire.messages``, ``conch.wire.job_store``)::

    conch.reply.<host>.<pid>.<hex> list     worker: msgpack replies      the gateway process or BLS
      [REPLY_PREFIX]                        (expire 60 s after a push)   client that owns it (BLMPOP)
    conch.reply.batch.<job>.<hex>  list     worker (same)                that batch job's attempt
    celery-task-meta-<job>         string   worker (an async job's       gateway (status, result),
      [JOB_RESULT_PREFIX]          + chan.  reply), Celery (a batch      Celery's AsyncResult; the
                                            job's result), gateway       channel of the same name
                                            (cancel); Celery's format    wakes waiters
    conch.job.<job>                hash     gateway (submit, cancel),    gateway (status); worker
      [JOB_RECORD_PREFIX]                   batch job (progress)         and batch job (cancelled)
    conch.stream.<id>              stream   gateway (its head entry      gateways (a client that
      [STREAM_PREFIX]                       0-1: model, version, id);    reconnects: XRANGE, XREAD)
                                            worker: a kept decoupled
                                            request's replies, entry id
                                            <attempt>-<seq> (expires)
    conch.stream.<id>/lease        string   gateways reading the stream  worker (is_cancelled,
      [STREAM_LEASE_SUFFIX]                 (SET PX, refreshed)          admission), gateway (the
                                                                         grace withdraw, reconnect)
    conch.cancel.<id>              string   gateway: the caller of a     worker (a running model's
      [CANCEL_PREFIX]                       request a worker took went   is_cancelled(), at most
                                            away (SET EX; wire.          every half second)
                                            cancellation)
    conch.dataset                  string   the first dispatcher to      dispatchers, after they
      [DATASET]                             reach Redis: a random id     reconnect (another id, or
                                            (SET NX, never expires)      none: Redis lost its data)

Workers and statistics (``conch.wire.worker_reports``, ``conch.wire.statistics``,
``conch.wire.model_metrics``)::

    conch.workers                  set      worker (its id, every beat)  gateway, BLS (who is live;
      [WORKERS]                                                          prunes expired ids)
    conch.worker.<id>              string   worker: JSON model states,   gateway, BLS (readiness,
      [WORKER_PREFIX]                       expires unless refreshed     index, load results)
    conch.stats.<model>            hash     worker: <version>|<counter>  gateway (statistics API,
      [STATS_PREFIX]                        -> int, a script a batch     /metrics)
    conch.samples.<model>          list     worker: recent requests'    gateway (/metrics
      [SAMPLES_PREFIX]                      latencies, one entry each,   summaries)
                                            trimmed to the newest few
    conch.custom_metrics.<id>      string   worker: JSON snapshot of its gateway (/metrics)
      [CUSTOM_METRICS_PREFIX]               models' custom metrics,
                                            expires unless refreshed

Control plane (``conch.wire.control_bus``, ``repo_sync.events``)::

    conch.repository.events        channel  repo_sync: JSON a model or   workers, gateways
      [REPOSITORY_EVENTS]                   version added/changed/removed
    conch.repository.generation    string   repo_sync (INCR a pass that  workers, gateways (catch up
      [REPOSITORY_GENERATION]               changed), load/unload (INCR) on what pub/sub lost)
    conch.control                  channel  model control API: JSON      workers, gateways
      [CONTROL_COMMANDS]                    load / unload commands
    conch.models.loaded            set      model control API            workers, gateways
      [LOADED_MODELS]                                                    (explicit mode)
    conch.models.load_ids          hash     model control API: model ->  workers (answer the latest
      [LOAD_IDS]                            id of its latest load        load)
    conch.override.config.<model>  string   model control API: a load's  workers, gateways
      [OVERRIDE_PREFIX]                     config JSON                  (explicit mode)
    conch.override.files.<model>   hash     model control API: a load's  workers, gateways (explicit
      [OVERRIDE_FILES_PREFIX]               file: overrides, path->bytes mode; SCANned for models)
    conch.logging                  channel  logging API: JSON, the       workers, gateways
      [LOG_COMMANDS]                        settings a POST changed
    conch.logging.settings         string   logging API: JSON, every     workers, gateways (at start
      [LOG_SETTINGS]                        setting the API has changed  and on what pub/sub lost)
    conch.trace                    channel  trace API: JSON, the         workers, gateways
      [TRACE_COMMANDS]                      settings a POST changed
    conch.trace.settings           string   trace API: JSON, every       workers, gateways (at start
      [TRACE_SETTINGS]                      setting the API has changed  and on what pub/sub lost)
    conch.traffic                  hash     traffic split API: model ->  gateways, gRPC servers
      [TRAFFIC_SPLITS]                      JSON weights by version and  (HGETALL, at most once a
                                            shadow (wire.traffic_split)  second per process)
    conch.shadow.<model>           stream   gateways: a shadow copy's    operators (XRANGE); capped
      [SHADOW_PREFIX]                       answer, one entry each       at about 1,000 entries
    conch.shm.system.<host>        hash     shared-memory API (register, gateways and gRPC servers on
      [SHM_REGIONS_PREFIX]                  unregister): region -> JSON  that host (an infer call
                                            key, offset, byte_size       naming a region, status)

The shared response cache (``--cache-config redis,...``; ``conch.wire.cache_store``)::

    conch.cache.entry.<hash>       string   gateways, gRPC servers: an   the same (GET on a cached
      [CACHE_ENTRY_PREFIX]                  answer, msgpack (the insert  model's request; the get
                                            script)                      script)
    conch.cache.lru                zset     the get and insert scripts:  the insert script (evicts
      [CACHE_LRU]                           <hash> -> last use (clock)   the least recently used)
    conch.cache.sizes              hash     insert script: <hash> ->     insert script (what an
      [CACHE_SIZES]                         bytes                        eviction frees)
    conch.cache.bytes              string   insert script (INCRBY,       insert script (the bound)
      [CACHE_BYTES]                         DECRBY): bytes held          operators
    conch.cache.clock              string   the scripts (INCR): the      the scripts
      [CACHE_CLOCK]                         last-use order

kombu's own bookkeeping for the Celery queue (``_kombu.binding.*``, ``unacked_mutex``)
is kombu's and not named here.
"""

from __future__ import annotations

# Model queues (a Celery queue each, in kombu's Redis layout).
QUEUE_PREFIX = "conch.model."
PRIORITY_SEP = "\x06\x16"  # kombu's separator for priority sub-lists
# '/' is in no model name: "x.wake" is a model whose queue must not be model x's wake list.
WAKE_SUFFIX = "/wake"
IN_FLIGHT_SUFFIX = "/in_flight"  # a queue's tags in unacked (conch.wire.work_owed)
IN_FLIGHT_CLASS_SUFFIX = "/in_flight_class"  # tag -> online|async|offline, beside it
# A bundle's tag -> "<requests beyond the first> <priority step> <deadline>" (broker.py).
BUNDLED_SUFFIX = "/bundled"
# A request a forming batch holds, popped from a queue with a max_queue_size: tag -> its
# priority step. It still counts against the bound, as Triton's pending batch does.
HELD_SUFFIX = "/held"
# The Celery queue of job tasks (batch jobs): every worker takes them but --batch-jobs=false ones.
JOBS_QUEUE = "conch.jobs"
# Messages in flight: kombu's default keys, so its restore_visible sees our messages.
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
ATTEMPTS = "conch.attempts"
DEADLETTER = "conch.deadletter"
# + "global.<resource>" or "host.<host>.<device>.<resource>": a sorted set of the holds of a
# rate-limit resource's copies, by lease end (conch.wire.rate_limits)
RATE_LIMIT_PREFIX = "conch.ratelimit."
# + "<model>/<step index>": the holds of an ensemble step's in-flight slots (its
# max_inflight_requests), as a rate-limit pool ('/' is in no model name)
ENSEMBLE_SLOTS_PREFIX = "conch.ensemble_slots."

# Replies and job results.
REPLY_PREFIX = "conch.reply."
STREAM_PREFIX = "conch.stream."  # + a request's message id (32 hex digits)
STREAM_LEASE_SUFFIX = "/lease"
CANCEL_PREFIX = "conch.cancel."  # + a request's message id: its caller went away
JOB_RESULT_PREFIX = "celery-task-meta-"  # Celery's Redis result backend key
JOB_RECORD_PREFIX = "conch.job."
DATASET = "conch.dataset"  # names what Redis holds: gone or changed when Redis lost it

# Workers and statistics.
WORKERS = "conch.workers"
WORKER_PREFIX = "conch.worker."
STATS_PREFIX = "conch.stats."
SAMPLES_PREFIX = "conch.samples."
CUSTOM_METRICS_PREFIX = "conch.custom_metrics."

# Control plane.
REPOSITORY_EVENTS = "conch.repository.events"  # {"model", "version", "change", "at", ...}
REPOSITORY_GENERATION = "conch.repository.generation"  # bumped by every repository change
CONTROL_COMMANDS = "conch.control"  # {"action": "load"|"unload", "model", ...} from the API
LOADED_MODELS = "conch.models.loaded"  # explicit mode: the models loaded through the API
LOAD_IDS = "conch.models.load_ids"  # explicit mode: model -> id of its latest load command
# Two prefixes neither of which starts the other: model "files.x" and model x's files.
OVERRIDE_PREFIX = "conch.override.config."  # explicit load's config override, by model
OVERRIDE_FILES_PREFIX = "conch.override.files."  # explicit load's file: overrides, by model
LOG_COMMANDS = "conch.logging"  # {"log_info": false, ...}: what one logging request changed
LOG_SETTINGS = "conch.logging.settings"  # JSON: every log setting the logging API changed
TRACE_COMMANDS = "conch.trace"  # {"trace_rate": "10", ...}: what one trace request changed
TRACE_SETTINGS = "conch.trace.settings"  # JSON: every trace setting the trace API changed
TRAFFIC_SPLITS = "conch.traffic"  # model -> JSON traffic split (conch.wire.traffic_split)
SHADOW_PREFIX = "conch.shadow."  # + model: a stream of its shadow copies' answers
# + a host name: the system shared-memory regions registered with the frontends on that
# host (conch.frontend.shared_memory); /dev/shm is the host's, so its regions are too.
SHM_REGIONS_PREFIX = "conch.shm.system."

# The shared response cache (conch.wire.cache_store): entries, and the LRU bookkeeping.
CACHE_ENTRY_PREFIX = "conch.cache.entry."  # + the request's hash (hex)
CACHE_LRU = "conch.cache.lru"
CACHE_SIZES = "conch.cache.sizes"
CACHE_BYTES = "conch.cache.bytes"
CACHE_CLOCK = "conch.cache.clock"

__all__ = [
    "ATTEMPTS",
    "BUNDLED_SUFFIX",
    "CACHE_BYTES",
    "CACHE_CLOCK",
    "CACHE_ENTRY_PREFIX",
    "CACHE_LRU",
    "CACHE_SIZES",
    "CANCEL_PREFIX",
    "CONTROL_COMMANDS",
    "CUSTOM_METRICS_PREFIX",
    "DATASET",
    "DEADLETTER",
    "ENSEMBLE_SLOTS_PREFIX",
    "IN_FLIGHT_CLASS_SUFFIX",
    "IN_FLIGHT_SUFFIX",
    "JOBS_QUEUE",
    "JOB_RECORD_PREFIX",
    "JOB_RESULT_PREFIX",
    "LOADED_MODELS",
    "LOAD_IDS",
    "LOG_COMMANDS",
    "LOG_SETTINGS",
    "OVERRIDE_FILES_PREFIX",
    "OVERRIDE_PREFIX",
    "PRIORITY_SEP",
    "QUEUE_PREFIX",
    "RATE_LIMIT_PREFIX",
    "REPLY_PREFIX",
    "REPOSITORY_EVENTS",
    "REPOSITORY_GENERATION",
    "SAMPLES_PREFIX",
    "SHADOW_PREFIX",
    "SHM_REGIONS_PREFIX",
    "STATS_PREFIX",
    "STREAM_LEASE_SUFFIX",
    "STREAM_PREFIX",
    "TRACE_COMMANDS",
    "TRACE_SETTINGS",
    "TRAFFIC_SPLITS",
    "UNACKED",
    "UNACKED_INDEX",
    "WAKE_SUFFIX",
    "WORKERS",
    "WORKER_PREFIX",
]
