"""MqttClient with paho's network side on the event loop (LoopNetwork), and failing over to
another broker: many clients in one process on a real Mosquitto, stopped and restarted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.wire.mqtt import Message, MqttClient, MqttSettings, Will
from agent.wire.mqtt_loop import LoopNetwork
from tests.mqtt_support import Broker

CLIENTS = 150


async def _until(check: object, limit_s: float = 30.0) -> None:
    async with asyncio.timeout(limit_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.05)


def test_many_clients_on_one_loop_connect_talk_and_come_back(broker: Broker) -> None:
    async def scenario() -> tuple[int, int, int]:
        network = LoopNetwork(max_connecting=16, seed=1)
        got: list[Message] = []
        clients = [
            MqttClient(
                broker.settings(client_id=f"c{i}"),
                network=network,
                on_message=got.append if i == 0 else None,
            )
            for i in range(CLIENTS)
        ]
        for client in clients:
            await client.start()
        assert network.waiting[0] <= 16  # no more than the window waits for a CONNACK
        await clients[0].subscribe("t/#")
        await _until(lambda: all(c.connected for c in clients))
        await asyncio.gather(*(c.publish(f"t/{i}", b"x") for i, c in enumerate(clients)))
        await _until(lambda: len(got) == CLIENTS)
        connects = network.connects
        # The broker goes away and comes back: every client reconnects by itself.
        broker.stop()
        await _until(lambda: not any(c.connected for c in clients))
        broker.start()
        await _until(lambda: all(c.connected for c in clients), 60)
        got.clear()
        await clients[-1].publish("t/again", b"y")  # the subscription was renewed
        await _until(lambda: [m.topic for m in got] == ["t/again"])
        await asyncio.gather(*(c.stop() for c in clients))
        return connects, network.connects, network.clients

    first, total, left = asyncio.run(scenario())
    assert first == CLIENTS
    assert total >= 2 * CLIENTS
    assert left == 0


def test_a_clean_stop_sends_no_will_and_a_lost_connection_does(broker: Broker) -> None:
    async def scenario() -> list[bytes]:
        network = LoopNetwork()
        wills: list[bytes] = []
        watcher = MqttClient(broker.settings(client_id="watcher"),
                             on_message=lambda m: wills.append(m.payload))  # fmt: skip
        await watcher.start()
        await watcher.subscribe("will/#")
        polite = MqttClient(broker.settings(client_id="polite", will=Will("will/polite", b"p",
                                                                           retain=False)),
                            network=network)  # fmt: skip
        await polite.start()
        await polite.wait_connected()
        await polite.stop()
        # Another connection under the same client id: the broker drops the first one, which
        # did not say goodbye, and sends its will (it stays away: a long backoff).
        lost = MqttClient(broker.settings(client_id="lost", reconnect_min_s=60,
                                          will=Will("will/lost", b"l", retain=False)),
                          network=network)  # fmt: skip
        await lost.start()
        await lost.wait_connected()
        usurper = MqttClient(broker.settings(client_id="lost"))
        await usurper.start()
        await usurper.wait_connected()
        await _until(lambda: wills == [b"l"] and not lost.connected)
        for client in (lost, usurper, watcher):
            await client.stop()
        return wills

    assert asyncio.run(scenario()) == [b"l"]


def test_clients_fail_over_to_the_next_broker(broker: Broker, tmp_path: Path) -> None:
    second = Broker(tmp_path / "second")
    second.start()
    try:
        backup = (("127.0.0.1", second.port),)

        async def scenario() -> tuple[tuple[str, int], tuple[str, int], int]:
            threaded = MqttClient(broker.settings(client_id="threaded", brokers=backup))
            looped = MqttClient(broker.settings(client_id="looped", brokers=backup),
                                network=LoopNetwork())  # fmt: skip
            for client in (threaded, looped):
                await client.start()
                await client.wait_connected()
            before = looped.broker
            broker.stop()  # the first broker is gone: both move to the second
            await _until(lambda: threaded.broker[1] == second.port and threaded.connected
                         and looped.broker[1] == second.port and looped.connected)  # fmt: skip
            got: list[Message] = []
            listener = MqttClient(MqttSettings("127.0.0.1", second.port, "listener"),
                                  on_message=got.append)  # fmt: skip
            await listener.start()
            await listener.subscribe("over/#")
            await threaded.publish("over/threaded", b"1")
            await looped.publish("over/looped", b"2")
            await _until(lambda: len(got) == 2)
            for client in (threaded, looped, listener):
                await client.stop()
            return before, looped.broker, len(got)

        before, after, delivered = asyncio.run(scenario())
        assert before == ("127.0.0.1", broker.port)
        assert after == ("127.0.0.1", second.port)
        assert delivered == 2
    finally:
        second.stop()


def test_settings_list_each_broker_once_in_order() -> None:
    settings = MqttSettings("a", 1, "c", brokers=(("b", 2), ("a", 1), ("c", 3)))
    assert settings.addresses() == (("a", 1), ("b", 2), ("c", 3))
