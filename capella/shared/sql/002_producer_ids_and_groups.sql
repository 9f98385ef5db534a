-- Shared queues, version 2: one producer-id space for every node.

-- Ids for producers that number their own messages (capella/core/producer_ids.py): never
-- answered twice, by any node. Catalog.take_producer_id makes each answer durable first.
create sequence capella_producer_ids as bigint minvalue 0 start with 0 no cycle;
