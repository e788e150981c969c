"""The producer's transactions (the TransactionManager, its states, its requests to the
transaction coordinator): a room of the producer, since the Sender and the producer drive
it and it reads their batches; nothing else imports it."""
