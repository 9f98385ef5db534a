"""The model and its rules: messages, blocks, queues, subscriptions, the cluster."""
