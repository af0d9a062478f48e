"""Step 2: stage factories. Each returns an object with ``async def run(request)``."""

from __future__ import annotations

import os


class Greet:
    def __init__(self, greeting: str):
        self.greeting = greeting

    async def run(self, request):
        return {"text": f"{self.greeting}, {request.data['name']}"}


class Shout:
    def __init__(self, suffix: str, gpu_id: int | None):
        self.suffix, self.gpu_id = suffix, gpu_id

    async def run(self, request):
        return {
            "text": request.data["text"].upper() + self.suffix,
            "pid": os.getpid(),
            "gpu_id": self.gpu_id,
        }


def create_greet(greeting: str) -> Greet:
    return Greet(greeting)


def create_shout(suffix: str, gpu_id: int | None = None) -> Shout:
    # gpu_id is a standard kwarg: injected because this signature declares it.
    return Shout(suffix, gpu_id)
