"""Live telephony gateway: Twilio Media Streams and Genesys AudioHook streams in, call events and audio
frames on Kafka out (as `callqa replay` sends them). See README.md beside this file."""
