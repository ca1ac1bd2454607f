output "topic_ids" {
  description = "Event name -> topic id."
  value       = { for name, topic in google_pubsub_topic.events : name => topic.id }
}

output "dead_letter_topic_ids" {
  description = "Function name -> dead-letter topic id."
  value       = { for name, topic in google_pubsub_topic.dead_letters : name => topic.id }
}

output "push_subscriptions" {
  description = "Function name -> push subscription name (push mode)."
  value       = { for name, sub in google_pubsub_subscription.push : name => sub.name }
}

output "raw_topic_ids" {
  description = "Raw topic name -> topic id."
  value       = { for name, topic in google_pubsub_topic.raw : name => topic.id }
}
