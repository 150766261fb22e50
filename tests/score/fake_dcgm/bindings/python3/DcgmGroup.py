"""FAKE of DCGM's ``DcgmGroup`` class and its ``samples`` namespace, for tests: DCGM cannot
exist here."""

import dcgm_agent
import dcgm_fields
import dcgm_structs


class DcgmGroupSamples:
    def __init__(self, dcgmHandle, groupId, dcgmGroup):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId

    def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
        dcgm_agent.dcgmWatchFields(self._dcgmHandle.handle, self._groupId, fieldGroup.fieldGroupId,
                                   updateFreq, maxKeepAge, maxKeepSamples)

    def UnwatchFields(self, fieldGroup):
        dcgm_agent.dcgmUnwatchFields(self._dcgmHandle.handle, self._groupId, fieldGroup.fieldGroupId)


class DcgmGroup:
    def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=dcgm_structs.DCGM_GROUP_EMPTY):
        self._dcgmHandle = dcgmHandle
        if groupId is None and groupName is None:
            raise ValueError("Either groupId or groupName is required")
        self._groupId = groupId if groupId is not None else dcgm_agent.dcgmGroupCreate(
            dcgmHandle.handle, groupType, groupName)
        self.name = groupName
        self.samples = DcgmGroupSamples(dcgmHandle, self._groupId, self)

    def AddGpu(self, gpuId):
        dcgm_agent.dcgmGroupAddDevice(self._dcgmHandle.handle, self._groupId, gpuId)

    def GetGpuIds(self):
        info = dcgm_agent.dcgmGroupGetInfo(self._dcgmHandle.handle, self._groupId)
        return [e.entityId for e in info.entityList[:info.count] if e.entityGroupId == dcgm_fields.DCGM_FE_GPU]

    def GetId(self):
        return self._groupId

    def Delete(self):
        self.samples = None
        if self._groupId is not None:
            dcgm_agent.dcgmGroupDestroy(self._dcgmHandle.handle, self._groupId)
        self._groupId = None
