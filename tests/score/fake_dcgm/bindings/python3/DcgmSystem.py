"""FAKE of DCGM's ``DcgmSystem`` classes (discovery, field updates), for tests: DCGM cannot
exist here."""

import dcgm_agent


class DcgmSystemDiscovery:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle

    def GetAllGpuIds(self):
        return dcgm_agent.dcgmGetAllDevices(self._dcgmHandle.handle)

    def GetAllSupportedGpuIds(self):
        return dcgm_agent.dcgmGetAllSupportedDevices(self._dcgmHandle.handle)

    def GetGpuAttributes(self, gpuId):
        return dcgm_agent.dcgmGetDeviceAttributes(self._dcgmHandle.handle, gpuId)


class DcgmSystem:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle
        self.discovery = DcgmSystemDiscovery(dcgmHandle)

    def UpdateAllFields(self, waitForUpdate):
        dcgm_agent.dcgmUpdateAllFields(self._dcgmHandle.handle, waitForUpdate)
