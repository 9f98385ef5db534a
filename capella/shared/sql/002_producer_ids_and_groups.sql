-- Shared queues, version 2: one producer-id space for every node, and what a consumer group
-- keeps beside its cursor.

-- Ids for producers that number their own messages (capella/core/producer_ids.py): never
-- answered twice, by any node. Catalog.take_producer_id makes each answer durable first.
create sequence capella_producer_ids as bigint minvalue 0 start with 0 no cycle;

-- A cursor's group (the consumer group's own name, kept when the subscription's name could not
-- hold it) and the metadata of its last commit (capella/core/subscription.py); null: none.
alter table capella_subscriptions add column group_id text, add column metadata text;
