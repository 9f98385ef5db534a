-- Shared queues, version 1: the tables and the one function a flush commits through.
-- Every name starts with capella_: the database may hold other software's tables.
-- Times of messages are epoch seconds (double precision) from clock_timestamp() read under the
-- queue's row lock: one clock for every node.

create table capella_queues (
    name text primary key,
    next_id bigint not null default 1,   -- the id the next kept message gets
    first_id bigint not null default 1,  -- the first id retention kept
    definition jsonb not null,
    created timestamptz not null default now(),
    updated timestamptz not null default now()
);

-- One row per uploaded object (a flush's multi-queue object, or a compacted block).
create table capella_objects (
    object_id bigserial primary key,
    key text not null unique,
    node text not null,
    size bigint not null,
    live_bytes bigint not null default 0,  -- bytes of the segments that point into it
    state text not null default 'live' check (state in ('live', 'dead')),
    kind text not null default 'flush' check (kind in ('flush', 'block')),  -- block: compacted
    created timestamptz not null default now(),
    dead_since timestamptz,
    results jsonb  -- what capella_commit_object answered: a retried commit answers it again
);
create index capella_objects_dead on capella_objects (dead_since) where state = 'dead';

-- Where a queue's kept messages lie: one stored batch, ids first_id..last_id.
create table capella_segments (
    queue text not null references capella_queues (name) on delete cascade,
    first_id bigint not null,
    last_id bigint not null,
    object_id bigint not null references capella_objects (object_id),
    byte_offset bigint not null,
    byte_size bigint not null,
    count int not null,                 -- messages in the stored batch, skipped ones included
    skip int[] not null default '{}',   -- batch positions that are duplicates (dead bytes)
    time double precision not null,
    primary key (queue, first_id)
);
create index capella_segments_object on capella_segments (object_id);

-- Identities as runs: source's external ids first_ext..last_ext have ids first_id.. in order.
-- The runs of one (queue, source) never overlap.
create table capella_identity_runs (
    queue text not null references capella_queues (name) on delete cascade,
    source text not null,
    first_ext bigint not null,
    last_ext bigint not null,
    first_id bigint not null,
    primary key (queue, source, first_ext)
);

-- The highest external id stored per (queue, source): a run wholly above it is new.
create table capella_sources (
    queue text not null references capella_queues (name) on delete cascade,
    source text not null,
    highest_ext bigint not null,
    primary key (queue, source)
);

create table capella_subscriptions (
    queue text not null references capella_queues (name) on delete cascade,
    name text not null,
    last_id bigint not null,
    replica boolean not null default false,
    created timestamptz not null default now(),
    updated timestamptz not null default now(),
    primary key (queue, name)
);

create table capella_nodes (
    name text primary key,
    token text not null,
    url text not null,
    lease_until timestamptz not null
);

-- Keep the kept run source's first_ext..last_ext (ids from p_id), as one more row or by
-- extending the run it continues (the same source, consecutive external ids and ids).
create function capella_keep_run(p_queue text, p_source text, p_first bigint, p_last bigint, p_id bigint)
returns void language plpgsql as $$
declare
    v_prev record;
begin
    select first_ext, last_ext, first_id into v_prev from capella_identity_runs
        where queue = p_queue and source = p_source and first_ext < p_first
        order by first_ext desc limit 1;
    if found and v_prev.last_ext = p_first - 1
            and v_prev.first_id + (v_prev.last_ext - v_prev.first_ext) + 1 = p_id then
        update capella_identity_runs set last_ext = p_last
            where queue = p_queue and source = p_source and first_ext = v_prev.first_ext;
    else
        insert into capella_identity_runs (queue, source, first_ext, last_ext, first_id)
            values (p_queue, p_source, p_first, p_last, p_id);
    end if;
    insert into capella_sources (queue, source, highest_ext) values (p_queue, p_source, p_last)
        on conflict (queue, source)
        do update set highest_ext = greatest(capella_sources.highest_ext, excluded.highest_ext);
end $$;

-- The stored runs of (queue, source) that overlap p_first..p_last, by first_ext: the last one
-- starting at or below p_first, then those starting inside (index range scans, no filter scan).
create function capella_overlaps(p_queue text, p_source text, p_first bigint, p_last bigint)
returns table (first_ext bigint, last_ext bigint, first_id bigint) language sql stable as $$
    select * from (
        (select r.first_ext, r.last_ext, r.first_id from capella_identity_runs r
            where r.queue = p_queue and r.source = p_source and r.first_ext <= p_first
            order by r.first_ext desc limit 1)
        union all
        (select r.first_ext, r.last_ext, r.first_id from capella_identity_runs r
            where r.queue = p_queue and r.source = p_source and r.first_ext > p_first
              and r.first_ext <= p_last)
    ) o where o.last_ext >= p_first order by o.first_ext
$$;

-- Commit one uploaded object: its batches get their ids, duplicates are found, segments and
-- identities are recorded, in one transaction (the caller's statement). Answers a jsonb array,
-- one [first_id, time, [[position, count, id], ...]] per batch (positions position.. are
-- duplicates of the messages id..; first_id 0: every message was a
-- duplicate; -1: the queue does not exist). The object key makes it idempotent: committing a
-- key again answers what the first commit answered and changes nothing.
--
-- Batch i is (b_queue[i], b_offset[i], b_size[i], b_count[i]); run j is (r_batch[j], a 1-based
-- batch number, r_source[j], r_first[j]..r_last[j], r_index[j], the 0-based batch position of
-- its first message), runs ordered by batch then position, never covering a position twice.
-- Positions no run covers are kept and get the identity (p_own, their id).
create function capella_commit_object(
    p_key text, p_node text, p_size bigint, p_own text,
    b_queue text[], b_offset bigint[], b_size bigint[], b_count int[],
    r_batch int[], r_source text[], r_first bigint[], r_last bigint[], r_index int[]
) returns jsonb language plpgsql as $$
declare
    v_object bigint;
    v_results jsonb := '[]';
    v_time numeric;
    v_live bigint := 0;
    v_next bigint;
    v_kept int;
    v_pos int;         -- the next batch position not yet looked at
    v_dups int;        -- duplicates before v_pos in this batch
    v_skip int[];
    v_dup_runs jsonb;
    v_high bigint;
    v_of bigint[];     -- the stored runs a run overlaps: first_ext, last_ext, first_id
    v_ol bigint[];
    v_oi bigint[];
    k int;
    v_ext bigint;      -- (an integer FOR loop would make its variable an int: ids are bigint)
    v_a bigint;        -- a piece of a run that is stored already: v_a..v_b, at position v_p
    v_b bigint;
    v_p int;
    v_start_id bigint;
    v_gap int;
    v_touched text[] := '{}';
    j int := 1;
    n_runs int := coalesce(array_length(r_batch, 1), 0);
begin
    insert into capella_objects (key, node, size) values (p_key, p_node, p_size)
        on conflict (key) do nothing returning object_id into v_object;
    if v_object is null then
        return (select results from capella_objects where key = p_key);
    end if;
    -- In name order, so committers of overlapping queue sets cannot deadlock.
    perform 1 from capella_queues where name = any (b_queue) order by name for update;
    v_time := extract(epoch from clock_timestamp());
    for i in 1 .. coalesce(array_length(b_queue, 1), 0) loop
        select next_id into v_next from capella_queues where name = b_queue[i];
        if not found then
            while j <= n_runs and r_batch[j] = i loop
                j := j + 1;
            end loop;
            v_results := v_results || jsonb_build_array(jsonb_build_array(-1, v_time, '[]'::jsonb));
            continue;
        end if;
        v_pos := 0;
        v_dups := 0;
        v_skip := '{}';
        v_dup_runs := '[]';
        loop
            -- The positions before the next run (or to the end) have no explicit identity.
            if j <= n_runs and r_batch[j] = i then
                v_gap := r_index[j] - v_pos;
            else
                v_gap := b_count[i] - v_pos;
            end if;
            if v_gap > 0 then
                v_start_id := v_next + v_pos - v_dups;
                v_high := (select highest_ext from capella_sources where queue = b_queue[i] and source = p_own);
                if v_high is null or v_high < v_start_id then
                    perform capella_keep_run(b_queue[i], p_own, v_start_id, v_start_id + v_gap - 1, v_start_id);
                else
                    -- Someone produced (p_own, X) explicitly with X above the ids given so far:
                    -- that identity stays the first one's.
                    v_ext := v_start_id;
                    while v_ext < v_start_id + v_gap loop
                        if not exists (select 1 from capella_overlaps(b_queue[i], p_own, v_ext, v_ext)) then
                            perform capella_keep_run(b_queue[i], p_own, v_ext, v_ext, v_ext);
                        end if;
                        v_ext := v_ext + 1;
                    end loop;
                end if;
                v_pos := v_pos + v_gap;
            end if;
            exit when not (j <= n_runs and r_batch[j] = i);
            -- Run j: positions r_index[j].., external ids r_first[j]..r_last[j].
            v_high := (select highest_ext from capella_sources where queue = b_queue[i] and source = r_source[j]);
            v_of := null;
            if v_high is not null and r_first[j] <= v_high then
                select array_agg(o.first_ext), array_agg(o.last_ext), array_agg(o.first_id)
                    into v_of, v_ol, v_oi
                    from capella_overlaps(b_queue[i], r_source[j], r_first[j], r_last[j]) o;
            end if;
            if v_of is null then
                perform capella_keep_run(b_queue[i], r_source[j], r_first[j], r_last[j], v_next + v_pos - v_dups);
            else
                -- Some are stored already: the stored runs split it into kept and duplicate
                -- pieces (they are disjoint and in order), each handled whole.
                v_ext := r_first[j];  -- the first external id not placed yet
                for k in 1 .. array_length(v_of, 1) loop
                    v_a := greatest(v_of[k], r_first[j]);
                    v_b := least(v_ol[k], r_last[j]);
                    if v_a > v_ext then
                        perform capella_keep_run(b_queue[i], r_source[j], v_ext, v_a - 1,
                                                 v_next + v_pos + (v_ext - r_first[j]) - v_dups);
                    end if;
                    v_p := v_pos + (v_a - r_first[j])::int;
                    v_skip := v_skip || array(select generate_series(v_p, v_p + (v_b - v_a)::int));
                    v_dup_runs := v_dup_runs || jsonb_build_array(jsonb_build_array(v_p, v_b - v_a + 1, v_oi[k] + (v_a - v_of[k])));
                    v_dups := v_dups + (v_b - v_a + 1)::int;
                    v_ext := v_b + 1;
                end loop;
                if v_ext <= r_last[j] then
                    perform capella_keep_run(b_queue[i], r_source[j], v_ext, r_last[j],
                                             v_next + v_pos + (v_ext - r_first[j]) - v_dups);
                end if;
            end if;
            v_pos := v_pos + (r_last[j] - r_first[j] + 1)::int;
            j := j + 1;
        end loop;
        v_kept := b_count[i] - v_dups;
        if v_kept > 0 then
            insert into capella_segments (queue, first_id, last_id, object_id, byte_offset, byte_size, count, skip, time)
                values (b_queue[i], v_next, v_next + v_kept - 1, v_object, b_offset[i], b_size[i], b_count[i],
                        v_skip, v_time::double precision);
            update capella_queues set next_id = v_next + v_kept where name = b_queue[i];
            v_live := v_live + b_size[i];
            if not b_queue[i] = any (v_touched) then
                v_touched := v_touched || b_queue[i];
            end if;
        end if;
        v_results := v_results || jsonb_build_array(jsonb_build_array(
            case when v_kept > 0 then v_next else 0 end, v_time, v_dup_runs));
    end loop;
    update capella_objects set live_bytes = v_live, results = v_results,
           state = case when v_live = 0 then 'dead' else 'live' end,
           dead_since = case when v_live = 0 then now() end
        where object_id = v_object;
    for i in 1 .. coalesce(array_length(v_touched, 1), 0) loop
        perform pg_notify('capella_shared',
                          v_touched[i] || ':' || (select next_id from capella_queues where name = v_touched[i]));
    end loop;
    return v_results;
end $$;
