"""Audio front end: telephony codecs, audio files, resampling and Whisper's log-mel features."""
