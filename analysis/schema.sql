-- sdctrace study database: what `sdc diff` loads (analysis/load.py), one set of rows per pair.
-- analysis/SCHEMA.md documents every column. Keys are documented, not declared: a pair
-- is replaced by deleting its rows and inserting the new ones in one transaction.
-- Every table but `runs`, `finetune_eval`, `finetune_predictions` and `sharpness` carries the pair_id
-- of `pairs`; those four are keyed by (run_id, rank) and shared by every pair a run belongs to.

CREATE TABLE IF NOT EXISTS sdctrace_schema (
    version INTEGER NOT NULL                  -- analysis.load.SCHEMA_VERSION that created the database
);

-- One row per rank of every run loaded (golden, suspect, replay). Key: (run_id, rank).
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    path VARCHAR NOT NULL,                    -- run directory as given to `sdc diff`
    node_label VARCHAR,
    role VARCHAR,                             -- train, replay, ...
    world_size INTEGER,
    schema_version INTEGER,
    config_fingerprint VARCHAR,
    seed BIGINT,
    data_order_fingerprint VARCHAR,
    fingerprint_algorithm VARCHAR,
    device VARCHAR,
    created_unix DOUBLE,
    config JSON,
    versions JSON,
    determinism JSON,
    extra JSON,
    segments INTEGER,                         -- log segment files read
    records BIGINT,                           -- TENSOR and EVENT records read
    complete BOOLEAN,                         -- the log ends with an END record (clean close)
    torn_tail BOOLEAN,                        -- the log ends inside a record (crash mid-write)
    last_step BIGINT,                         -- last completed step (last `step` event)
    status VARCHAR                            -- complete, failed, crashed (no END record) or corrupt
);

-- One row per pair. Key: pair_id.
CREATE TABLE IF NOT EXISTS pairs (
    pair_id VARCHAR NOT NULL,
    golden_path VARCHAR NOT NULL,
    suspect_path VARCHAR NOT NULL,
    golden_run_id VARCHAR NOT NULL,           -- lowest rank's run id
    suspect_run_id VARCHAR NOT NULL,
    replay_paths VARCHAR[],
    replay_run_ids VARCHAR[],
    twin_run_id VARCHAR,                      -- the golden fine-tune's shuffle-seed twin (null: none)
    baseline BOOLEAN,                         -- the suspect is golden's pretraining shuffle-seed twin (sdc diff --baseline)
    world_size INTEGER,
    ranks INTEGER,                            -- ranks compared
    steps_per_bucket INTEGER,                 -- pipeline setting the pair was diffed with
    created_unix DOUBLE,                      -- when the diff ran
    sdctrace_version VARCHAR
);

-- Per pair and rank: how far the comparison went. Key: (pair_id, rank).
CREATE TABLE IF NOT EXISTS pair_ranks (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    golden_run_id VARCHAR,
    suspect_run_id VARCHAR,
    golden_last_step BIGINT,
    suspect_last_step BIGINT,
    compared_through BIGINT,                  -- min of the two: later steps are not compared
    golden_status VARCHAR,                    -- complete, failed, crashed (no END record) or corrupt
    suspect_status VARCHAR,
    lost_steps BIGINT                         -- compared steps corruption made unknown (lost_ranges)
);

-- Every tensor record of both runs up to compared_through, joined.
-- Key: (pair_id, rank, step, microbatch, name, phase, occurrence).
CREATE TABLE IF NOT EXISTS event_diffs (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    microbatch BIGINT,                        -- null: a gradient no microbatch was the last to change (SCHEMA.md)
    name VARCHAR NOT NULL,                    -- site or parameter
    phase VARCHAR NOT NULL,                   -- forward, backward, grad, param, input
    occurrence INTEGER NOT NULL,              -- 0, or n for the n-th repeat of this key in the step (log order)
    status VARCHAR NOT NULL,                  -- equal, differ, golden_only, suspect_only
    equal BOOLEAN NOT NULL,                   -- fingerprints equal (bit-identical tensors)
    golden_fingerprint UBIGINT,
    suspect_fingerprint UBIGINT,
    golden_l2 FLOAT,
    suspect_l2 FLOAT,
    golden_absmax FLOAT,
    suspect_absmax FLOAT,
    golden_nan BIGINT,
    suspect_nan BIGINT,
    golden_inf BIGINT,
    suspect_inf BIGINT,
    meta VARCHAR,                             -- dtype and shape, e.g. float32[8,64,128]
    golden_segment INTEGER,                   -- where the record is: segment file index ...
    golden_offset BIGINT,                     -- ... and byte offset of its frame
    suspect_segment INTEGER,
    suspect_offset BIGINT
);

-- Per pair and rank: the earliest differing event in execution order (same columns as event_diffs).
CREATE TABLE IF NOT EXISTS first_divergence (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    microbatch BIGINT,
    name VARCHAR NOT NULL,
    phase VARCHAR NOT NULL,
    occurrence INTEGER NOT NULL,
    status VARCHAR NOT NULL,
    equal BOOLEAN NOT NULL,
    golden_fingerprint UBIGINT,
    suspect_fingerprint UBIGINT,
    golden_l2 FLOAT,
    suspect_l2 FLOAT,
    golden_absmax FLOAT,
    suspect_absmax FLOAT,
    golden_nan BIGINT,
    suspect_nan BIGINT,
    golden_inf BIGINT,
    suspect_inf BIGINT,
    meta VARCHAR,
    golden_segment INTEGER,
    golden_offset BIGINT,
    suspect_segment INTEGER,
    suspect_offset BIGINT
);

-- Per compared step: the divergence frontier. Key: (pair_id, rank, step).
CREATE TABLE IF NOT EXISTS divergence_steps (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    events BIGINT NOT NULL,                   -- events compared
    differing BIGINT NOT NULL,                -- events not equal (including one-sided)
    sites_differing BIGINT NOT NULL,          -- distinct sites with a differing forward or backward event
    inputs_differing BIGINT NOT NULL,
    grads_differing BIGINT NOT NULL,
    params_differing BIGINT NOT NULL,
    first_microbatch BIGINT,                  -- the step's first differing event, in execution order
    first_name VARCHAR,
    first_phase VARCHAR
);

-- Per step: both runs' loss (the `step` event's sum over microbatches). Key: (pair_id, rank, step).
CREATE TABLE IF NOT EXISTS loss (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    golden_loss DOUBLE,
    suspect_loss DOUBLE,
    diff DOUBLE,                              -- suspect_loss - golden_loss
    rel_diff DOUBLE,                          -- diff / |golden_loss|
    lr DOUBLE                                 -- golden's learning rate at the step (first parameter group)
);

-- Loss spikes on either side (rule in SCHEMA.md). Key: (pair_id, rank, step, side).
CREATE TABLE IF NOT EXISTS loss_spikes (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    side VARCHAR NOT NULL,                    -- golden or suspect
    loss DOUBLE,
    baseline DOUBLE,                          -- median loss of the previous steps (null without history)
    ratio DOUBLE                              -- loss / baseline
);

-- Parameter drift at each checkpoint step both runs hold. Key: (pair_id, rank, step, "group").
CREATE TABLE IF NOT EXISTS param_drift (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,                     -- the checkpoint holds the state before this step
    "group" VARCHAR NOT NULL,                 -- * (all tensors), layers.N, or a top-level module name
    elements BIGINT NOT NULL,
    golden_norm DOUBLE,                       -- ||theta_h||_2
    diff_norm DOUBLE,                         -- ||theta_s - theta_h||_2
    drift DOUBLE                              -- diff_norm / golden_norm
);

-- RQ1, from lockstep replay logs: one row per site_mismatch event.
-- Key: (pair_id, replay_run_id, rank, step, microbatch, site, phase).
CREATE TABLE IF NOT EXISTS site_mismatch (
    pair_id VARCHAR NOT NULL,
    replay_run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    microbatch BIGINT,
    site VARCHAR,
    phase VARCHAR,                            -- forward or backward
    elements BIGINT,
    mismatched BIGINT,
    frequency DOUBLE,                         -- mismatched / elements
    severity DOUBLE,                          -- mean relative difference of the differing elements (null: none)
    max_rel DOUBLE
);

-- RQ2, from parameter-sync replay logs: one row per grad_noise event.
-- Key: (pair_id, replay_run_id, rank, step, name).
CREATE TABLE IF NOT EXISTS grad_noise (
    pair_id VARCHAR NOT NULL,
    replay_run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    name VARCHAR,                             -- parameter, or * for all together
    diff_l2 DOUBLE,
    golden_l2 DOUBLE,
    ratio DOUBLE                              -- noise-to-signal: diff_l2 / golden_l2
);

-- Fault ground truth (`fault` events) with what detected it. Key: (pair_id, side, rank, segment, offset).
CREATE TABLE IF NOT EXISTS faults (
    pair_id VARCHAR NOT NULL,
    side VARCHAR NOT NULL,                    -- run whose log holds the event: golden or suspect
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    microbatch BIGINT,
    site VARCHAR,
    op VARCHAR,
    phase VARCHAR,                            -- forward or backward
    kind VARCHAR,
    elements BIGINT,
    indices BIGINT[],
    original DOUBLE[],
    corrupted DOUBLE[],
    detail JSON,
    segment INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    traced_site VARCHAR,                      -- the traced site the fault happened in (null: untraced)
    fingerprint_detected BOOLEAN,             -- that site's event differs (null: untraced or not compared)
    abft_flagged BOOLEAN                      -- an ABFT check at the same unit flagged (null: none checked)
);

-- Every ABFT check, with ground truth. Key: (pair_id, side, rank, step, microbatch, site, phase, op) + order.
CREATE TABLE IF NOT EXISTS abft (
    pair_id VARCHAR NOT NULL,
    side VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    microbatch BIGINT,
    site VARCHAR,
    op VARCHAR,
    phase VARCHAR,
    m BIGINT,
    k BIGINT,
    n BIGINT,
    residual DOUBLE,
    bound DOUBLE,
    verdict VARCHAR,                          -- ok or flag
    faulted BOOLEAN NOT NULL,                 -- a fault of the same side hit this unit
    outcome VARCHAR NOT NULL                  -- tp, fp, fn, tn (of the unit)
);

-- Detector scores per rank. Key: (pair_id, rank, detector, side).
CREATE TABLE IF NOT EXISTS detection_scores (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    detector VARCHAR NOT NULL,                -- fingerprint or abft
    side VARCHAR NOT NULL,                    -- pair (fingerprint), golden or suspect (abft)
    units BIGINT NOT NULL,
    tp BIGINT NOT NULL,
    fp BIGINT NOT NULL,
    fn BIGINT NOT NULL,
    tn BIGINT NOT NULL,
    propagated BIGINT NOT NULL                -- fingerprint: differs downstream of a fault (0 for abft)
);

-- The guard's detectors run offline over the suspect's steps (pipelines/alarms.py): one row per step and
-- detector, plus one per step for the guard's default combination (detector 'guard'). Key: (pair_id, rank, step, detector).
CREATE TABLE IF NOT EXISTS detector_alarms (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    run_id VARCHAR NOT NULL,                  -- the suspect's
    node_label VARCHAR,
    step BIGINT NOT NULL,
    detector VARCHAR NOT NULL,                -- non_finite, loss_spike, grad_norm_spike, abft_flags, twin_mismatch, guard
    fired BOOLEAN NOT NULL,
    measured DOUBLE,                          -- the detector's statistic when it fired (guard: how many fired); else null
    threshold DOUBLE,                         -- what it crossed (guard: 1); null when it did not fire
    detail VARCHAR,                           -- the alarm's detail (guard: the detectors that fired)
    faults BIGINT NOT NULL,                   -- fault events of the run the detectors saw (ground truth)
    guarded BOOLEAN NOT NULL,                 -- the guard re-ran the step: evidence and faults are its first run's
    loss DOUBLE,                              -- the step's loss the detectors saw
    wall_s DOUBLE                             -- the step's wall time (`step` event), the guard's re-runs included
);

-- One row per `guard` event of the suspect (a guarded recording). Key: (pair_id, rank, step).
CREATE TABLE IF NOT EXISTS guard_decisions (
    pair_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    run_id VARCHAR NOT NULL,
    node_label VARCHAR,
    step BIGINT NOT NULL,
    detectors VARCHAR[],                      -- the detectors that fired on the first run
    outcome VARCHAR,                          -- transient, deterministic, unresolved, unclassified
    action VARCHAR,                           -- continue, skip, stop
    accepted BIGINT,                          -- the attempt the optimizer stepped with (null: skip, stop)
    runs BIGINT,                              -- runs of the step, the first included: runs - 1 were recomputed
    first_run_faults BIGINT,                  -- fault events of the first (flagged) run
    accepted_run_faults BIGINT                -- fault events of the accepted run
);

-- RQ3, fine-tuned accuracy: one row per `finetune_eval` event of every run loaded (golden,
-- suspect, twin). Key: (run_id, rank, step, task); replaced whenever the run is loaded again.
CREATE TABLE IF NOT EXISTS finetune_eval (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,                     -- evaluated with the weights before this step (the last: after training)
    task VARCHAR,
    examples BIGINT,                          -- test examples
    correct BIGINT,
    accuracy DOUBLE,                          -- correct / examples
    chance DOUBLE,                            -- accuracy of guessing: 1 / choices
    collapsed BOOLEAN                         -- no better than chance (rule in SCHEMA.md)
);

-- RQ3, the loss surface: one row per `sharpness` event of a golden or suspect run (record_run(sharpness=K)).
-- Key: (run_id, rank, step); replaced whenever the run is loaded again.
CREATE TABLE IF NOT EXISTS sharpness (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,                     -- of the state before this step (a checkpoint's)
    value DOUBLE,                             -- top eigenvalue of the loss's Hessian (estimate)
    iterations BIGINT,                        -- Hessian-vector products computed
    converged BOOLEAN,                        -- the estimate changed by at most the tolerance in its last iteration
    residual DOUBLE,                          -- ||Hy - value y|| / |value| of its eigenvector estimate y
    method VARCHAR,                           -- hvp (exact) or finite-difference
    microbatch BIGINT                         -- the microbatch whose loss it is (0: the step's first)
);

-- RQ3, fine-tuned predictions: one row per `finetune_prediction` event. Key: (run_id, rank, step, task, example).
CREATE TABLE IF NOT EXISTS finetune_predictions (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    task VARCHAR,
    example BIGINT,                           -- index in the task's test split
    predicted INTEGER,                        -- choice index the model named (0 = A)
    answer INTEGER                            -- the right choice index
);

-- Corruption found while reading (only loaded with --skip-corrupt; otherwise the diff fails).
CREATE TABLE IF NOT EXISTS corruptions (
    pair_id VARCHAR NOT NULL,
    run_id VARCHAR,
    side VARCHAR NOT NULL,
    rank INTEGER,
    path VARCHAR NOT NULL,                    -- file
    "offset" BIGINT NOT NULL,                 -- byte offset of the bad frame (0: whole file, e.g. missing)
    reason VARCHAR NOT NULL
);

-- What corruption hid, per range skipped while reading (only with --skip-corrupt). Key: (pair_id, path, "offset").
-- No difference is reported for a record the other side lost here, and no first divergence lies in these steps.
CREATE TABLE IF NOT EXISTS lost_ranges (
    pair_id VARCHAR NOT NULL,
    run_id VARCHAR,
    side VARCHAR NOT NULL,
    rank INTEGER,
    path VARCHAR NOT NULL,                    -- file (a missing segment file: bytes 0)
    "offset" BIGINT NOT NULL,                 -- first byte skipped
    bytes BIGINT NOT NULL,                    -- bytes skipped
    records BIGINT NOT NULL,                  -- records lost, at least
    first_step BIGINT,                        -- first step missing or incomplete (null: from the start)
    last_step BIGINT                          -- last one (null: through the end of the log)
);

-- Node labels of each pair's two runs (their lowest rank, as pairs records them), for the
-- named queries. Key: pair_id.
CREATE VIEW IF NOT EXISTS pair_nodes AS
SELECT
    p.pair_id,
    (SELECT min(node_label) FROM runs WHERE run_id = p.golden_run_id) AS golden_node,
    (SELECT min(node_label) FROM runs WHERE run_id = p.suspect_run_id) AS suspect_node,
    (SELECT min(role) FROM runs WHERE run_id = p.suspect_run_id) AS role,      -- train or finetune
    coalesce(p.baseline, false) AS baseline                                     -- the suspect is the drift baseline
FROM pairs AS p;

-- Each pair's runs as a whole: the worst status over ranks (corrupt > crashed > failed > complete)
-- and the compared steps corruption made unknown, over ranks. Key: pair_id.
CREATE VIEW IF NOT EXISTS pair_status AS
SELECT
    pair_id,
    arg_max(golden_status, list_position(['complete', 'failed', 'crashed', 'corrupt'], golden_status)) AS golden_status,
    arg_max(suspect_status, list_position(['complete', 'failed', 'crashed', 'corrupt'], suspect_status)) AS suspect_status,
    sum(lost_steps) AS lost_steps
FROM pair_ranks
GROUP BY pair_id;

-- Each rank's first divergence (first_divergence) and its place in execution order across the pair's ranks
-- (SCHEMA.md, "Execution order"): the rank that diverged first is where corruption entered. Key: (pair_id, rank).
-- `position` is the record's index among its rank's records of the step, in log order: ranks of one layout
-- record the same sequence of tensors, so it compares across ranks. `divergence_order` is 1 for the rank(s)
-- that diverged first, 2 for the next, ...; ranks tie only at the same point of that order.
CREATE VIEW IF NOT EXISTS first_divergence_ranked AS
WITH
first_steps AS (
    SELECT DISTINCT pair_id, rank, step FROM first_divergence
),
positioned AS (
    SELECT
        e.pair_id, e.rank, e.step, e.microbatch, e.name, e.phase, e.occurrence,
        row_number() OVER (
            PARTITION BY e.pair_id, e.rank, e.step
            ORDER BY coalesce(e.golden_segment, e.suspect_segment), coalesce(e.golden_offset, e.suspect_offset)
        ) - 1 AS position
    FROM event_diffs AS e
    JOIN first_steps USING (pair_id, rank, step)
),
firsts AS (
    SELECT
        f.*,
        p.position,
        -- the step-level records (gradients, parameters) after every microbatch
        CASE WHEN f.phase IN ('grad', 'param') THEN NULL ELSE f.microbatch END AS order_microbatch,
        list_position(['input', 'forward', 'backward', 'grad', 'param'], f.phase) AS order_phase,
        -- what a pipeline stage received (tracer/pipeline.py: pipeline.S-D.recv.out) came from a stage that
        -- differed before: after every other record of the microbatch's phase, further stages later (forward:
        -- activations go up the stages; backward: gradients come down)
        CASE WHEN regexp_matches(f.name, '^pipeline\.\d+-\d+\.recv\.out$') THEN
            CAST(regexp_extract(f.name, '-(\d+)\.recv', 1) AS BIGINT) * CASE f.phase WHEN 'backward' THEN -1 ELSE 1 END
        END AS order_hop
    FROM first_divergence AS f
    JOIN positioned AS p
      ON p.pair_id = f.pair_id AND p.rank = f.rank AND p.step = f.step AND p.name = f.name AND p.phase = f.phase
     AND p.occurrence = f.occurrence AND p.microbatch IS NOT DISTINCT FROM f.microbatch
)
SELECT
    * EXCLUDE (order_microbatch, order_phase, order_hop),
    rank() OVER (
        PARTITION BY pair_id ORDER BY step, order_microbatch NULLS LAST, order_phase, order_hop NULLS FIRST, position
    ) AS divergence_order
FROM firsts;

-- Which slice of each sharded (DTensor) parameter a run's rank holds and fingerprints, from its header's
-- extra.shards (docs/log-format.md; FSDP2, parallelize_module, HSDP). Key: (run_id, rank, name). `slice` is
-- the shard as indexing writes it, `[64:128, 0:32]`: rows 64..127 of a (128, 32) weight.
CREATE VIEW IF NOT EXISTS param_shards AS
WITH entries AS (
    SELECT run_id, rank, unnest(map_entries(CAST(json_extract(extra, '$.shards') AS MAP(VARCHAR, STRUCT(
        mesh_shape BIGINT[], mesh_dims VARCHAR[], placements VARCHAR[], global_shape BIGINT[], offsets BIGINT[],
        local_shape BIGINT[]))))) AS e
    FROM runs
    WHERE json_extract(extra, '$.shards') IS NOT NULL
)
SELECT
    run_id, rank, e.key AS name, e.value.mesh_shape, e.value.mesh_dims, e.value.placements, e.value.global_shape,
    e.value.offsets, e.value.local_shape,
    '[' || array_to_string(list_transform(range(1, len(e.value.offsets) + 1),
        lambda i: e.value.offsets[i] || ':' || (e.value.offsets[i] + e.value.local_shape[i])), ', ') || ']' AS slice
FROM entries;

-- RQ3: each pretraining pair's drift per checkpoint step (param_drift's group '*', combined over
-- ranks), beside its baseline pair's drift at the same step and whether the step lies in the pair's
-- growth window (rule in SCHEMA.md). Key: (pair_id, step).
CREATE VIEW IF NOT EXISTS drift_curve AS
WITH
info AS (
    SELECT p.pair_id, p.golden_run_id, n.suspect_node AS node_label, n.baseline
    FROM pairs AS p JOIN pair_nodes AS n USING (pair_id)
    WHERE n.role = 'train'
),
drift AS (
    SELECT pair_id, step,
        sqrt(sum(diff_norm * diff_norm)) / nullif(sqrt(sum(golden_norm * golden_norm)), 0) AS drift
    FROM param_drift
    WHERE "group" = '*'
    GROUP BY pair_id, step
),
curve AS (
    SELECT i.pair_id, i.node_label, i.golden_run_id, i.baseline, d.step, d.drift
    FROM drift AS d JOIN info AS i USING (pair_id)
),
baseline_curve AS (
    SELECT golden_run_id, step, avg(drift) AS baseline_drift
    FROM curve
    WHERE baseline
    GROUP BY golden_run_id, step
),
marked AS (
    SELECT c.*, b.baseline_drift,
        NOT c.baseline AND b.baseline_drift > 0 AND c.drift >= 0.5 * b.baseline_drift AS saturated
    FROM curve AS c
    LEFT JOIN baseline_curve AS b USING (golden_run_id, step)
),
bounds AS (
    SELECT pair_id,
        min(step) FILTER (WHERE drift > 0) AS onset_step,
        min(step) FILTER (WHERE saturated) AS saturation_step
    FROM marked
    GROUP BY pair_id
)
SELECT m.pair_id, m.node_label, m.golden_run_id, m.baseline, m.step, m.drift, m.baseline_drift,
    b.onset_step, b.saturation_step,
    coalesce(m.drift > 0 AND m.step >= b.onset_step
             AND (b.saturation_step IS NULL OR m.step < b.saturation_step), false) AS in_window
FROM marked AS m JOIN bounds AS b USING (pair_id);

-- RQ3: each pretraining pair's drift rate, the slope of ln(drift) over its growth window, and its
-- suspect's SDC rate (rules in SCHEMA.md). Key: pair_id.
CREATE VIEW IF NOT EXISTS drift_rates AS
WITH
fit AS (
    SELECT pair_id,
        count(*) FILTER (WHERE in_window) AS points,
        min(step) FILTER (WHERE in_window) AS first_step,
        max(step) FILTER (WHERE in_window) AS last_step,
        regr_slope(ln(drift), step) FILTER (WHERE in_window) AS drift_rate,
        regr_r2(ln(drift), step) FILTER (WHERE in_window) AS r2,
        max(step) AS final_step,
        arg_max(drift, step) AS final_drift
    FROM drift_curve
    GROUP BY pair_id
),
fault_counts AS (
    SELECT pair_id, count(*) AS faults FROM faults WHERE side = 'suspect' GROUP BY pair_id
),
compared AS (
    SELECT pair_id, max(compared_through) + 1 AS steps FROM pair_ranks GROUP BY pair_id
)
SELECT c.pair_id, c.node_label, c.golden_run_id, c.baseline, f.points, f.first_step, f.last_step,
    c.saturation_step, f.drift_rate, f.r2, f.final_step, f.final_drift,
    coalesce(k.faults, 0) AS faults, s.steps, coalesce(k.faults, 0) / s.steps AS sdc_rate
FROM (SELECT DISTINCT pair_id, node_label, golden_run_id, baseline, saturation_step FROM drift_curve) AS c
JOIN fit AS f USING (pair_id)
LEFT JOIN fault_counts AS k USING (pair_id)
LEFT JOIN compared AS s USING (pair_id);

-- Incident bundles (`sdc incident load`, analysis/incident_signatures.py): one row per bundle output whose golden
-- and suspect bits differ, with its defect signature (replay/signature.py). Key: (incident_id, output).
CREATE TABLE IF NOT EXISTS incident_signatures (
    incident_id VARCHAR,
    bundle VARCHAR,
    node_label VARCHAR,
    run_id VARCHAR,
    golden_node VARCHAR,
    golden_run_id VARCHAR,
    step BIGINT,
    microbatch BIGINT,
    site VARCHAR,
    phase VARCHAR,
    output INTEGER,
    op VARCHAR,
    dtype VARCHAR,
    shape BIGINT[],
    shape_class VARCHAR,
    elements BIGINT,
    differing BIGINT,
    sign_flips BIGINT,
    exponent_flips BIGINT,
    mantissa_flips BIGINT,
    top_bit INTEGER,
    top_bit_count BIGINT,
    bits MAP(INTEGER, BIGINT),
    ulps_max DOUBLE,
    ulps_median DOUBLE,
    period BIGINT,
    period_offset BIGINT
);

-- The reproductions run so far of each loaded bundle (its verdicts.jsonl), one row per run of reproduce.py or
-- `sdc incident reproduce`, gathered from every copy of the bundle loaded. Key: (incident_id, machine, unix).
CREATE TABLE IF NOT EXISTS incident_verdicts (
    incident_id VARCHAR,
    machine VARCHAR,
    verdict VARCHAR,
    emulated VARCHAR,
    repeats INTEGER,
    device VARCHAR,
    torch VARCHAR,
    unix DOUBLE
);

-- sdc diff --tolerance MAP: event_diffs rows whose bits differ within the map's band for their place (status
-- 'within_tolerance') are not SDC; per pair, how many, at how many places, over how many steps. Key: pair_id.
CREATE VIEW IF NOT EXISTS within_tolerance AS
SELECT pair_id,
    count(*) AS events,
    count(DISTINCT (name, phase)) AS places,
    count(DISTINCT step) AS steps
FROM event_diffs
WHERE status = 'within_tolerance'
GROUP BY pair_id;
