"""What the device's fleet link and the fleet manager share: the MQTT adapter, the topic
layout and the SQLite store both sides open. Nothing here imports the serving stack."""
