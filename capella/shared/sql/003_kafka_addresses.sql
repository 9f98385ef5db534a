-- Shared queues, version 3: where each node serves Kafka clients, kept with its name lease.

-- The address a node's Kafka listener advertises (capella/kafka/nodes.py): every node lists the
-- live nodes' as brokers and picks a group's coordinator among them. Null: no [kafka] there.
alter table capella_nodes add column kafka_host text, add column kafka_port int;
